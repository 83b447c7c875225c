"""The GRPO loss, pure torch: per-token logprobs, the clipped surrogate with truncated
importance weights, its aggregation, and the stability metrics.

Conventions (every function here):
- Token tensors are (B, T-1), aligned to the *targets*: position t holds the logprob of
  token t+1 given tokens 0..t (`next_token_logprobs`). A sequence's loss mask aligned the
  same way is `loss_mask[1:]`; the first token (always prompt) is never a target.
- `mask` is 1.0 on generated (loss) tokens and 0.0 on prompt, observation and padding.
- `logp` is the trainer's logprob under the weights being updated (with grad); `logp_old`
  the trainer's logprob under the behaviour weights, computed before the update (detached);
  `logp_rollout` the engine's logprob recorded on the trajectory.

Per-token loss = w · −min(r·A, clip(r, 1−clip_low, 1+clip_high)·A) + kl_coef · k3, with
r = exp(logp − logp_old), w = min(exp(logp_old − logp_rollout), tis_cap) (detached) and
k3 = exp(logp_old − logp) − (logp_old − logp) − 1 (the low-variance KL estimate).

Aggregation over loss tokens only, with denominators of the whole (mini-)batch passed in,
so the sum of micro-batch losses equals the full-batch loss:
- `token_mean`: Σ per-token loss / (loss tokens in the batch);
- `seq_mean_token_mean`: Σ over sequences of (the sequence's token mean) / (sequences with
  at least one loss token in the batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from trainer.settings import TrainerSettings


@dataclass(frozen=True)
class Denominators:
    """What a (mini-)batch's loss is divided by: its loss tokens and its sequences with loss tokens."""

    tokens: int
    sequences: int

    @classmethod
    def of(cls, masks: Sequence[torch.Tensor]) -> Denominators:
        """From target-aligned masks, one 1-D tensor (or one (B, T-1) batch) each."""
        counts = [int(c) for m in masks for c in (m.reshape(-1, m.shape[-1]) > 0).sum(-1).tolist()]
        return cls.of_counts(counts)

    @classmethod
    def of_loss_masks(cls, loss_masks: Sequence[Sequence[int]]) -> Denominators:
        """From whole sequences' loss masks (not target-aligned: the first token is never a target);
        what every data-parallel rank computes for the global batch."""
        return cls.of_counts([sum(1 for m in mask[1:] if m > 0) for mask in loss_masks])

    @classmethod
    def of_counts(cls, counts: Sequence[int]) -> Denominators:
        return cls(tokens=sum(counts), sequences=sum(1 for c in counts if c > 0))


@dataclass(frozen=True)
class LossSums:
    """Token counts and sums of one micro-batch's update metrics; add them up, then divide."""

    tokens: int = 0
    clipped_low: int = 0
    clipped_high: int = 0
    entropy: float = 0.0

    def __add__(self, other: LossSums) -> LossSums:
        return LossSums(
            self.tokens + other.tokens,
            self.clipped_low + other.clipped_low,
            self.clipped_high + other.clipped_high,
            self.entropy + other.entropy,
        )

    def fractions(self) -> tuple[float, float, float]:
        """(clip fraction low, clip fraction high, mean entropy) over the loss tokens; 0 when none."""
        if self.tokens == 0:
            return 0.0, 0.0, 0.0
        return self.clipped_low / self.tokens, self.clipped_high / self.tokens, self.entropy / self.tokens


def next_token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """Logprob of each actual next token: logits (B, T, V), token_ids (B, T) → (B, T-1), fp32."""
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return logprobs.gather(-1, token_ids[:, 1:, None].long()).squeeze(-1)


def next_token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the full next-token distribution at each target position: (B, T, V) → (B, T-1)."""
    logprobs = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    return -(logprobs.exp() * logprobs).sum(-1)


def truncated_importance_weights(
    logp_old: torch.Tensor, logp_rollout: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """w = min(exp(logp_old − logp_rollout), cap) on loss tokens, 0 elsewhere; no gradient."""
    log_ratio = torch.where(mask > 0, (logp_old - logp_rollout).detach(), 0.0)
    return torch.clamp(log_ratio.exp(), max=cap) * mask


@dataclass(frozen=True)
class Ratio:
    """r = exp(logp − logp_old) on the loss tokens, as its log and its value, computed once per
    micro-batch for the loss and the clip counts. Off the loss tokens the log-ratio is 0 (r = 1),
    so a large drift there cannot overflow into NaNs."""

    log: torch.Tensor
    value: torch.Tensor

    @classmethod
    def of(cls, logp: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor) -> Ratio:
        log_ratio = torch.where(mask > 0, logp - logp_old.detach(), 0.0)
        return cls(log_ratio, log_ratio.exp())


def per_token_loss(
    ratio: Ratio,
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: TrainerSettings,
) -> torch.Tensor:
    """The module docstring's per-token loss, 0 off the loss tokens. advantages: (B,)."""
    adv = advantages[:, None].to(ratio.value.dtype)
    clipped = torch.clamp(ratio.value, 1.0 - settings.clip_low, 1.0 + settings.clip_high)
    surrogate = -torch.minimum(ratio.value * adv, clipped * adv)
    weights = truncated_importance_weights(logp_old.detach(), logp_rollout, mask, settings.tis_cap)
    loss = weights * surrogate
    if settings.kl_coef > 0:
        kl = (-ratio.log).exp() + ratio.log - 1.0
        loss = loss + settings.kl_coef * kl
    return loss * mask


def aggregate(
    token_loss: torch.Tensor, mask: torch.Tensor, aggregation: str, denominators: Denominators
) -> torch.Tensor:
    """This micro-batch's share of the batch loss (module docstring); 0 when the batch has no loss."""
    if aggregation == "token_mean":
        return (token_loss * mask).sum() / max(denominators.tokens, 1)
    if aggregation == "seq_mean_token_mean":
        per_sequence = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_sequence.sum() / max(denominators.sequences, 1)
    raise ValueError(f"unknown loss_aggregation {aggregation!r}: use token_mean or seq_mean_token_mean")


def clip_counts(
    ratio: Ratio, advantages: torch.Tensor, mask: torch.Tensor, settings: TrainerSettings
) -> tuple[int, int]:
    """Loss tokens clipped low (A<0, r<1−clip_low) and high (A>0, r>1+clip_high)."""
    with torch.no_grad():
        value = ratio.value.detach()
        adv = advantages[:, None]
        on = mask > 0
        low = on & (adv < 0) & (value < 1.0 - settings.clip_low)
        high = on & (adv > 0) & (value > 1.0 + settings.clip_high)
        return int(low.sum()), int(high.sum())


def policy_loss(
    logits: torch.Tensor,
    token_ids: torch.Tensor,
    logp_old: torch.Tensor,
    logp_rollout: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: TrainerSettings,
    denominators: Denominators,
) -> tuple[torch.Tensor, LossSums]:
    """One micro-batch: its share of the batch loss (with grad) and its metric sums."""
    ratio = Ratio.of(next_token_logprobs(logits, token_ids), logp_old, mask)
    token_loss = per_token_loss(ratio, logp_old, logp_rollout, advantages, mask, settings)
    loss = aggregate(token_loss, mask, settings.loss_aggregation, denominators)
    low, high = clip_counts(ratio, advantages, mask, settings)
    with torch.no_grad():
        entropy = float((next_token_entropy(logits) * mask).sum())
    return loss, LossSums(int((mask > 0).sum()), low, high, entropy)


def sft_loss(
    logits: torch.Tensor, token_ids: torch.Tensor, mask: torch.Tensor, denominators: Denominators
) -> torch.Tensor:
    """Cross-entropy on loss tokens, this micro-batch's share of the batch's token mean."""
    return -(next_token_logprobs(logits, token_ids) * mask).sum() / max(denominators.tokens, 1)


def effective_sample_size(log_weights: torch.Tensor) -> float:
    """(Σw)² / (N·Σw²) of w = exp(log_weights), computed in log space; 1.0 for no weights."""
    count = log_weights.numel()
    if count == 0:
        return 1.0
    lw = log_weights.double()
    log_ess = 2 * torch.logsumexp(lw, 0) - torch.logsumexp(2 * lw, 0) - math.log(count)
    return float(log_ess.exp())


@dataclass(frozen=True)
class MismatchMetrics:
    """Engine vs trainer (behaviour weights) on the generated tokens of a batch."""

    mean_logprob_diff: float  # mean |logp_old − logp_rollout|
    ess: float  # token-level ESS of exp(logp_old − logp_rollout), untruncated
    ess_seq: float  # sequence-level: weight = exp(Σ over the sequence's tokens of the log-ratio)


@dataclass(frozen=True)
class MismatchParts:
    """A share of a batch's mismatch figures as sums that add up across data-parallel ranks:
    Σ|log-ratio|, the token count, logsumexp of the token log-ratios and of twice them, and each
    sequence's summed log-ratio (in order)."""

    abs_sum: float = 0.0
    tokens: int = 0
    lse: float = -math.inf
    lse_twice: float = -math.inf
    sequences: tuple[float, ...] = ()


def mismatch_parts(
    logp_old: Sequence[torch.Tensor], logp_rollout: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
) -> MismatchParts:
    """From per-sequence target-aligned 1-D tensors; sequences without loss tokens are skipped."""
    token_lw: list[torch.Tensor] = []
    seq_lw: list[float] = []
    for old, rollout, mask in zip(logp_old, logp_rollout, masks, strict=True):
        on = mask > 0
        if not bool(on.any()):
            continue
        diff = (old.detach().double() - rollout.double())[on]
        token_lw.append(diff)
        seq_lw.append(float(diff.sum()))
    if not token_lw:
        return MismatchParts()
    tokens = torch.cat(token_lw)
    return MismatchParts(
        abs_sum=float(tokens.abs().sum()),
        tokens=tokens.numel(),
        lse=float(torch.logsumexp(tokens, 0)),
        lse_twice=float(torch.logsumexp(2 * tokens, 0)),
        sequences=tuple(seq_lw),
    )


def combine_mismatch(parts: Sequence[MismatchParts]) -> MismatchMetrics:
    """The figures of the whole batch from its parts (in batch order)."""
    count = sum(p.tokens for p in parts)
    if count == 0:
        return MismatchMetrics(0.0, 1.0, 1.0)
    lse = torch.logsumexp(torch.tensor([p.lse for p in parts], dtype=torch.float64), 0)
    lse_twice = torch.logsumexp(torch.tensor([p.lse_twice for p in parts], dtype=torch.float64), 0)
    sequences = torch.tensor([s for p in parts for s in p.sequences], dtype=torch.float64)
    return MismatchMetrics(
        mean_logprob_diff=sum(p.abs_sum for p in parts) / count,
        ess=float((2 * lse - lse_twice - math.log(count)).exp()),
        ess_seq=effective_sample_size(sequences),
    )


def mismatch_metrics(
    logp_old: Sequence[torch.Tensor], logp_rollout: Sequence[torch.Tensor], masks: Sequence[torch.Tensor]
) -> MismatchMetrics:
    """From per-sequence target-aligned 1-D tensors; sequences without loss tokens are skipped."""
    return combine_mismatch([mismatch_parts(logp_old, logp_rollout, masks)])
