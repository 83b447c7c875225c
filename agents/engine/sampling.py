"""Batched sampling with per-request seeds, temperature, top-k and top-p.

Each row draws one uniform number from a counter-based hash of (request seed, decode
step), then picks its token by inverse CDF over the filtered distribution. The draw
depends only on the request's own seed and step, not on which other requests share
the batch or on any global RNG state, so a seeded request gives the same tokens alone
or in a batch of 64, and the whole batch is sampled with a handful of tensor ops.

Logprobs are of the sampled token under the model distribution at the request's
temperature (temperature 0 → 1), before top-k/top-p renormalisation: what the trainer
recomputes for importance weights. A row that asks for `top_logprobs` k > 0 also gets the
k most likely tokens of that same distribution with their logprobs (OpenAI's
`top_logprobs`, SGLang's `top_logprobs_num`); the top-k is computed only for batches
where some row asks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from agents.engine.protocol import TopLogprobs

MASK32 = 0xFFFFFFFF
UNIFORM_BITS = 24  # float32 holds 24 bits of mantissa exactly


@dataclass(frozen=True)
class BatchSampling:
    """Per-row sampling settings as tensors (B,)."""

    temperature: torch.Tensor  # float32; below 1e-6 = greedy
    top_p: torch.Tensor  # float32; 1 = off
    top_k: torch.Tensor  # int64; <= 0 = off
    seed: torch.Tensor  # int64
    step: torch.Tensor  # int64: index of the token being sampled within the request
    top_logprobs: tuple[int, ...] = ()  # alternatives to return per row; empty = none asked

    @classmethod
    def build(
        cls,
        temperature: list[float],
        top_p: list[float],
        top_k: list[int],
        seed: list[int],
        step: list[int],
        top_logprobs: list[int] | None = None,
    ) -> BatchSampling:
        return cls(
            torch.tensor(temperature, dtype=torch.float32),
            torch.tensor(top_p, dtype=torch.float32),
            torch.tensor(top_k, dtype=torch.int64),
            torch.tensor(seed, dtype=torch.int64),
            torch.tensor(step, dtype=torch.int64),
            tuple(top_logprobs) if top_logprobs and any(top_logprobs) else (),
        )

    def next_step(self) -> BatchSampling:
        """The same rows' settings for the next token (step + 1)."""
        return replace(self, step=self.step + 1)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors (values stay below 2**59: no overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & MASK32
    x = x ^ (x >> 16)
    x = (x * 0x45D9F3B) & MASK32
    return x ^ (x >> 16)


def uniform(seed: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """One number in (0, 1) per row, a pure function of (seed, step)."""
    bits = _mix32((seed & MASK32) ^ _mix32((step * 0x9E3779B1 + (seed >> 32)) & MASK32))
    return ((bits >> (32 - UNIFORM_BITS)).to(torch.float32) + 0.5) / float(1 << UNIFORM_BITS)


def _filter(scaled: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Logits with tokens outside each row's top-k / top-p nucleus set to -inf."""
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = scaled.shape[-1]
    ranks = torch.arange(vocab)[None, :]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    drop = ranks >= k[:, None]
    probs = torch.softmax(sorted_logits, dim=-1)
    # Keep a token while the mass before it is below top_p (the first token always stays).
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, sorted_logits)


@dataclass(frozen=True)
class Sampled:
    tokens: torch.Tensor  # (B,) token ids
    logprobs: torch.Tensor  # (B,) logprob of each sampled token
    top: tuple[TopLogprobs, ...] = ()  # per row, when some row asked for alternatives; else empty


def sample(logits: torch.Tensor, params: BatchSampling) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (B, V) → (token ids (B,), logprobs of those tokens (B,))."""
    drawn = sample_with_alternatives(logits, params)
    return drawn.tokens, drawn.logprobs


def _alternatives(logprobs: torch.Tensor, wanted: tuple[int, ...]) -> tuple[TopLogprobs, ...]:
    """Each row's `wanted[i]` most likely tokens under `logprobs` (B, V)."""
    k = min(max(wanted), logprobs.shape[-1])
    values, ids = logprobs.topk(k, dim=-1)
    rows = zip(ids.tolist(), values.tolist(), wanted, strict=True)
    return tuple(tuple(zip(i[:n], v[:n], strict=True)) for i, v, n in rows)


def sample_with_alternatives(logits: torch.Tensor, params: BatchSampling) -> Sampled:
    """`sample`, plus each row's top alternatives when any row asked for them."""
    logits = logits.float()
    greedy = params.temperature < 1e-6  # as SGLang: a near-zero temperature is greedy
    temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    scaled = logits / temperature[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    vocab = logits.shape[-1]
    if bool((((params.top_k > 0) & (params.top_k < vocab)) | (params.top_p < 1)).any()):
        filtered = _filter(scaled, params.top_p, params.top_k)
        probs = torch.softmax(filtered, dim=-1)
    else:
        probs = logprobs.exp()
    cdf = probs.cumsum(dim=-1)
    target = uniform(params.seed, params.step) * cdf[:, -1]
    drawn = torch.searchsorted(cdf, target[:, None], right=True).squeeze(-1).clamp(max=logits.shape[-1] - 1)
    tokens = torch.where(greedy, logits.argmax(dim=-1), drawn)
    top = _alternatives(logprobs, params.top_logprobs) if params.top_logprobs else ()
    return Sampled(tokens, logprobs.gather(-1, tokens[:, None]).squeeze(-1), top)
