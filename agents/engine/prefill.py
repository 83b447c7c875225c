"""Prefill: turning queued prompts into keys/values, within a per-step token budget.

Short prompts that fit the budget together are prefilled in one batched forward,
right-padded to the longest (padding keys/values sit past each row's end, where decode
overwrites or masks them, so they never influence a real token). A prompt too long for
that is prefilled one chunk per step into its own cache, so one long prompt delays the
decoding requests by one chunk per step instead of by its whole length.
"""

from __future__ import annotations

import torch

from agents.engine.batch import RunningRequest
from trainer.model import KVCache, PolicyModel

# A prompt whose prefill completed: the request, its last position's logits (V,), its cache (one row).
Prefilled = tuple[RunningRequest, torch.Tensor, KVCache]


def prefill_step(model: PolicyModel, prefilling: list[RunningRequest], budget: int) -> list[Prefilled]:
    """Spend up to `budget` prompt tokens; returns the prompts that completed."""
    group = whole_prompt_group(prefilling, budget)
    completed: list[Prefilled] = []
    if group:
        budget -= len(group) * max(len(r.input_ids) for r in group)
        completed += prefill_whole(model, group)
    for request in [r for r in prefilling if r not in group]:
        if budget <= 0:
            break
        done, used = prefill_chunk(model, request, budget)
        budget -= used
        if done is not None:
            completed.append(done)
    return completed


def whole_prompt_group(prefilling: list[RunningRequest], budget: int) -> list[RunningRequest]:
    """Unstarted prompts that fit the budget together, counting the padding."""
    group: list[RunningRequest] = []
    longest = 0
    for request in prefilling:
        length = len(request.input_ids)
        if request.prefilled == 0 and (len(group) + 1) * max(longest, length) <= budget:
            group.append(request)
            longest = max(longest, length)
    return group


def prefill_whole(model: PolicyModel, group: list[RunningRequest]) -> list[Prefilled]:
    lengths = [len(r.input_ids) for r in group]
    longest = max(lengths)
    tokens = torch.tensor([r.input_ids + [0] * (longest - len(r.input_ids)) for r in group])
    cache = KVCache.empty(model.config, len(group), longest, model.dtype)
    logits = model.forward_cached(tokens, torch.zeros(len(group), dtype=torch.long), cache)
    last = logits[torch.arange(len(group)), torch.tensor(lengths) - 1]
    for request in group:
        request.prefilled = len(request.input_ids)
    return [(request, last[i], cache.row(i)) for i, request in enumerate(group)]


def prefill_chunk(model: PolicyModel, request: RunningRequest, budget: int) -> tuple[Prefilled | None, int]:
    """The next chunk of one long prompt; (completed or None, tokens used)."""
    total = len(request.input_ids)
    if request.prefill_cache is None:
        request.prefill_cache = KVCache.empty(model.config, 1, total, model.dtype)
    chunk = request.input_ids[request.prefilled : request.prefilled + budget]
    start = torch.tensor([request.prefilled])
    logits = model.forward_cached(torch.tensor([chunk]), start, request.prefill_cache)
    request.prefilled += len(chunk)
    if request.prefilled < total:
        return None, len(chunk)
    return (request, logits[0, -1], request.prefill_cache), len(chunk)
