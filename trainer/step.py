"""One training step on torch (pure of Kafka, SQL and clocks but the phase timers).

The step functions every backend runs: the torch backend (trainer/backends.py) and the megatron
backend (trainer/megatron_backend.py) call them with their model and optimizer behind
`TrainerBackend`; the loop (trainer/loop.py) and SFT (trainer/sft.py) call the backend, never
these directly; `bench trainer` runs `rl_step` as its baseline. What they take and return:

    @dataclass(frozen=True)
    class SftSequence: token_ids: TokenIds; loss_mask: LossMask

    @dataclass(frozen=True)
    class StepMetrics:
        loss, grad_norm, clip_frac_low, clip_frac_high, entropy, mean_logprob_diff,
        ess, ess_seq, reward_mean: float; tokens, trajectories: int;
        logprob_s, update_s: float; comm_s: float = 0.0

    def make_optimizer(model, settings: TrainerSettings, lr: float) -> torch.optim.Optimizer
    def rl_step(model, optimizer, samples: Sequence[TrainSample], settings: TrainerSettings,
                device: torch.device, temperature=1.0, ranks: DataParallel = SINGLE) -> StepMetrics
        # logprobs under the current (behaviour) weights, no grad, in micro-batches;
        # then `settings.updates_per_step` optimiser steps over mini-batches, each
        # accumulating micro-batches of at most `settings.micro_batch_tokens` tokens;
        # grad clip at `settings.grad_clip` (grad_norm reported before clipping).
    def sft_step(model, optimizer, sequences: Sequence[SftSequence], settings, device,
                 ranks=SINGLE) -> StepMetrics
        # cross-entropy on loss-masked tokens only.
        # `ranks` (trainer.data_parallel): every data-parallel rank passes the whole batch and
        # trains its share; losses are divided by the global batch's denominators.

Also here: `sequence_logprobs` (the trainer's per-token scores, no grad; what the
engine-match test and diagnostics compare) and `trains` (whether a sample carries loss).
Mini-batches are consecutive near-equal runs of the loss-bearing samples; the behaviour
logprobs of all of them are taken before the first update, in the same micro-batches the
updates use. Deterministic on CPU: same inputs and model/optimizer state give
bit-identical weights (at the same world size), so a resumed trainer continues exactly.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from streams.packed import LossMask, TokenIds
from trainer.batch import TrainSample, micro_batches
from trainer.data_parallel import SINGLE, DataParallel, rank_micro_batches
from trainer.loss import (
    Denominators,
    LossSums,
    MismatchMetrics,
    combine_mismatch,
    mismatch_parts,
    next_token_entropy,
    next_token_logprobs,
    policy_loss,
    sft_loss,
)
from trainer.settings import TrainerSettings


@dataclass(frozen=True)
class SftSequence:
    token_ids: TokenIds
    loss_mask: LossMask

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class StepMetrics:
    """One step's figures. With `updates_per_step` > 1, loss and grad_norm are means over the
    optimiser steps and the clip fractions and entropy cover every update pass. SFT steps
    have no importance weights: clip fractions 0, mean_logprob_diff 0, ESS 1."""

    loss: float
    grad_norm: float  # global norm before clipping
    clip_frac_low: float
    clip_frac_high: float
    entropy: float
    mean_logprob_diff: float
    ess: float
    ess_seq: float
    reward_mean: float  # over every sample, loss-masked members included
    tokens: int  # tokens of the sequences that went through the update
    trajectories: int  # every sample (sequence) handed in
    logprob_s: float
    update_s: float
    comm_s: float = 0.0  # of logprob_s + update_s: inside data-parallel collectives (CPU ranks)


@dataclass(frozen=True)
class _Tensors:
    """One padded micro-batch on the device; token tensors target-aligned (B, T-1)."""

    token_ids: torch.Tensor  # (B, T) long
    mask: torch.Tensor  # (B, T-1) fp32, 1 on loss tokens
    rollout_logprobs: torch.Tensor  # (B, T-1) fp32
    advantages: torch.Tensor  # (B,) fp32


def make_optimizer(model: nn.Module, settings: TrainerSettings, lr: float) -> torch.optim.Optimizer:
    """AdamW over the parameters that train (all, or the LoRA adapters); weight decay on matrices
    only (norm gains are not decayed)."""
    named = sorted((n, p) for n, p in model.named_parameters() if p.requires_grad)
    decay = [p for _, p in named if p.ndim >= 2]
    no_decay = [p for _, p in named if p.ndim < 2]
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=settings.betas, eps=settings.eps)


def _padded(arrays: Sequence[Sequence[float]], dtype: np.dtype, width: int) -> np.ndarray:
    out = np.zeros((len(arrays), width), dtype=dtype)
    for row, values in enumerate(arrays):
        out[row, : len(values)] = np.asarray(values, dtype=dtype)
    return out


def _tensors(items: Sequence[TrainSample] | Sequence[SftSequence], device: torch.device) -> _Tensors:
    """Right-padded (token 0, mask 0): causal attention keeps padding out of the real positions."""
    width = max(item.tokens for item in items)
    ids = torch.from_numpy(_padded([i.token_ids for i in items], np.dtype(np.int64), width))
    mask = torch.from_numpy(_padded([i.loss_mask for i in items], np.dtype(np.float32), width))
    rollout = np.zeros((len(items), width), dtype=np.float32)
    advantages = [0.0] * len(items)
    samples = [i for i in items if isinstance(i, TrainSample)]
    if samples:
        rollout = _padded([s.rollout_logprobs for s in samples], np.dtype(np.float32), width)
        advantages = [s.advantage for s in samples]
    return _Tensors(
        token_ids=ids.to(device),
        mask=(mask[:, 1:] > 0).float().to(device),
        rollout_logprobs=torch.from_numpy(rollout)[:, 1:].to(device),
        advantages=torch.tensor(advantages, dtype=torch.float32, device=device),
    )


def _trainable(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def trains(sample: TrainSample) -> bool:
    """Whether a sample contributes loss: not loss-masked and with at least one generated target."""
    return not sample.loss_masked and any(m > 0 for m in sample.loss_mask[1:])


def _mini_batches(samples: Sequence[TrainSample], count: int) -> list[list[TrainSample]]:
    """`count` consecutive, near-equal runs of samples (fewer when there are fewer samples; none
    when there are none: a batch whose members are all loss-masked trains nothing)."""
    if not samples:
        return []
    count = min(count, len(samples))
    bounds = [round(i * len(samples) / count) for i in range(count + 1)]
    return [list(samples[bounds[i] : bounds[i + 1]]) for i in range(count)]


def logits_of(model: nn.Module, token_ids: torch.Tensor, settings: TrainerSettings) -> torch.Tensor:
    """fp32 logits; under `trainer.dtype = "bfloat16"` the forward runs in autocast (fp32 master
    weights, bf16 matmuls), and the loss is always taken in fp32."""
    if settings.dtype == "float32":
        return model(token_ids).float()
    with torch.autocast(device_type=token_ids.device.type, dtype=torch.bfloat16):
        return model(token_ids).float()


def _logprobs_no_grad(
    model: nn.Module, batch: _Tensors, settings: TrainerSettings, temperature: float = 1.0
) -> torch.Tensor:
    with torch.no_grad():
        return next_token_logprobs(logits_of(model, batch.token_ids, settings) / temperature, batch.token_ids)


def sequence_logprobs(
    model: nn.Module, samples: Sequence[TrainSample], settings: TrainerSettings, device: torch.device
) -> list[torch.Tensor]:
    """The trainer's logprob of every next token of each sample, no grad: 1-D (tokens − 1) each,
    on the device; position t scores token t+1. Micro-batched as the step is."""
    out: list[torch.Tensor] = []
    for micro in micro_batches(samples, settings.micro_batch_tokens):
        logprobs = _logprobs_no_grad(model, _tensors(micro, device), settings)
        out += [logprobs[row, : s.tokens - 1] for row, s in enumerate(micro)]
    return out


@dataclass(frozen=True)
class _Plan:
    """One mini-batch on this rank: its micro-batches with their behaviour logprobs, and the
    denominators of the whole (global) mini-batch."""

    batches: list[tuple[_Tensors, torch.Tensor]]
    denominators: Denominators


def _rank_tensors(
    items: Sequence[TrainSample] | Sequence[SftSequence],
    settings: TrainerSettings,
    ranks: DataParallel,
    device: torch.device,
) -> list[_Tensors]:
    """This rank's micro-batches of `items` (`trainer.data_parallel`), an empty one as a one-row
    batch without loss tokens (it must still run: FSDP2's collectives pair up per pass)."""
    micros = rank_micro_batches(items, ranks.rank, ranks.size, settings.micro_batch_tokens)
    return [_tensors(micro, device) if micro else _empty_tensors(device) for micro in micros]


def _empty_tensors(device: torch.device) -> _Tensors:
    return _Tensors(
        token_ids=torch.zeros((1, 2), dtype=torch.int64, device=device),
        mask=torch.zeros((1, 1), dtype=torch.float32, device=device),
        rollout_logprobs=torch.zeros((1, 1), dtype=torch.float32, device=device),
        advantages=torch.zeros(1, dtype=torch.float32, device=device),
    )


def _update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    plan: _Plan,
    settings: TrainerSettings,
    temperature: float,
    ranks: DataParallel,
) -> tuple[float, float, LossSums]:
    """One optimiser step over a mini-batch's micro-batches: (this rank's share of the loss,
    the global grad norm before clip, this rank's sums)."""
    optimizer.zero_grad(set_to_none=True)
    total, sums = 0.0, LossSums()
    for batch, logp_old in plan.batches:
        loss, micro_sums = policy_loss(
            logits_of(model, batch.token_ids, settings) / temperature,
            batch.token_ids,
            logp_old,
            batch.rollout_logprobs,
            batch.advantages,
            batch.mask,
            settings,
            plan.denominators,
        )
        loss.backward()
        total += float(loss.detach())
        sums = sums + micro_sums
    grad_norm = ranks.clip_grad_norm(_trainable(model), settings.grad_clip)
    optimizer.step()
    return total, grad_norm, sums


def _mismatch(plans: list[_Plan], ranks: DataParallel) -> MismatchMetrics:
    """Engine vs trainer over the whole batch: each rank's parts per mini-batch, combined in batch
    order (mini-batch by mini-batch, ranks in order: the shares are contiguous)."""
    local = [
        mismatch_parts(
            [row for _, old in plan.batches for row in old],
            [row for batch, _ in plan.batches for row in batch.rollout_logprobs],
            [row for batch, _ in plan.batches for row in batch.mask],
        )
        for plan in plans
    ]
    gathered = ranks.gather(local)
    return combine_mismatch([parts[mini] for mini in range(len(plans)) for parts in gathered])


def rl_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    samples: Sequence[TrainSample],
    settings: TrainerSettings,
    device: torch.device,
    temperature: float = 1.0,
    ranks: DataParallel = SINGLE,
) -> StepMetrics:
    """The pinned RL step (module docstring). Samples without loss tokens (loss-masked members)
    count only in reward_mean and trajectories; a batch with none trains nothing. `temperature`
    is the rollouts' sampling temperature: logprobs are of the distribution the engine sampled
    from (logits / temperature), as the engine reports them, or the importance weights are off.
    `ranks`: every rank passes the same whole batch and trains its share of each mini-batch
    (`trainer.data_parallel`); the metrics are the whole batch's on every rank."""
    started = time.perf_counter()
    trained = [s for s in samples if trains(s)]
    plans: list[_Plan] = []
    for mini in _mini_batches(trained, settings.updates_per_step):
        batches = _rank_tensors(mini, settings, ranks, device)
        plans.append(
            _Plan(
                [(batch, _logprobs_no_grad(model, batch, settings, temperature)) for batch in batches],
                Denominators.of_loss_masks([s.loss_mask for s in mini]),
            )
        )
    mismatch = _mismatch(plans, ranks)
    logprob_s = time.perf_counter() - started
    losses, norms, sums = [], [], LossSums()
    for plan in plans:
        loss, norm, plan_sums = _update(model, optimizer, plan, settings, temperature, ranks)
        losses.append(loss)
        norms.append(norm)
        sums = sums + plan_sums
    losses, sums = _summed(losses, sums, ranks)
    clip_low, clip_high, entropy = sums.fractions()
    return StepMetrics(
        loss=sum(losses) / len(losses) if losses else 0.0,
        grad_norm=sum(norms) / len(norms) if norms else 0.0,
        clip_frac_low=clip_low,
        clip_frac_high=clip_high,
        entropy=entropy,
        mean_logprob_diff=mismatch.mean_logprob_diff,
        ess=mismatch.ess,
        ess_seq=mismatch.ess_seq,
        reward_mean=sum(s.reward for s in samples) / len(samples) if samples else 0.0,
        tokens=sum(s.tokens for s in trained),
        trajectories=len(samples),
        logprob_s=logprob_s,
        update_s=time.perf_counter() - started - logprob_s,
        comm_s=ranks.take_comm_s(),
    )


def _summed(losses: list[float], sums: LossSums, ranks: DataParallel) -> tuple[list[float], LossSums]:
    """Each update's loss and the metric sums over every rank (one collective)."""
    if ranks.size == 1:
        return losses, sums
    total = ranks.sum([*losses, sums.tokens, sums.clipped_low, sums.clipped_high, sums.entropy])
    tokens, low, high, entropy = total[len(losses) :]
    return total[: len(losses)], LossSums(round(tokens), round(low), round(high), entropy)


def sft_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    sequences: Sequence[SftSequence],
    settings: TrainerSettings,
    device: torch.device,
    ranks: DataParallel = SINGLE,
) -> StepMetrics:
    """One optimiser step of cross-entropy on the loss tokens (token mean over the whole batch;
    with `ranks`, each trains its share as `rl_step` does)."""
    started = time.perf_counter()
    batches = _rank_tensors(sequences, settings, ranks, device)
    denominators = Denominators.of_loss_masks([s.loss_mask for s in sequences])
    optimizer.zero_grad(set_to_none=True)
    total, entropy = 0.0, 0.0
    for batch in batches:
        logits = logits_of(model, batch.token_ids, settings)
        loss = sft_loss(logits, batch.token_ids, batch.mask, denominators)
        loss.backward()
        total += float(loss.detach())
        with torch.no_grad():
            entropy += float((next_token_entropy(logits) * batch.mask).sum())
    if ranks.size > 1:
        total, entropy = ranks.sum([total, entropy])
    grad_norm = 0.0
    if denominators.tokens:
        grad_norm = ranks.clip_grad_norm(_trainable(model), settings.grad_clip)
        optimizer.step()
    return StepMetrics(
        loss=total,
        grad_norm=grad_norm,
        clip_frac_low=0.0,
        clip_frac_high=0.0,
        entropy=entropy / max(denominators.tokens, 1),
        mean_logprob_diff=0.0,
        ess=1.0,
        ess_seq=1.0,
        reward_mean=0.0,
        tokens=sum(s.tokens for s in sequences),
        trajectories=len(sequences),
        logprob_s=0.0,
        update_s=time.perf_counter() - started,
        comm_s=ranks.take_comm_s(),
    )
