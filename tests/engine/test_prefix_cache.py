"""The prefix cache: multi-turn requests reuse the keys/values of earlier turns, exactly."""

from __future__ import annotations

from pathlib import Path

import torch

from agents.engine.prefix_cache import PrefixCache
from agents.engine.protocol import SamplingParams
from tests.engine.conftest import EngineFactory
from tests.engine.test_engine import TIMEOUT, full_forward_logprobs, prompt
from trainer.model import KVCache, ModelConfig

CONFIG = ModelConfig(
    vocab_size=100,
    hidden_size=16,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
    max_position=256,
)


def kv(length: int, fill: float) -> KVCache:
    cache = KVCache.empty(CONFIG, 1, length, torch.float32)
    cache.keys[0].fill_(fill)
    return cache


def test_lookup_finds_the_longest_block_aligned_prefix_and_leaves_a_token() -> None:
    cache = PrefixCache(capacity_tokens=1000, block_tokens=4)
    tokens = list(range(10, 30))
    cache.insert(tokens, kv(20, 1.0), length=19)  # 19 computed positions → 16 kept
    entry, matched = cache.lookup([*tokens, 5, 6])  # type: ignore[misc]
    assert matched == 16 and entry.keys[0].shape[1] == 16
    assert cache.lookup(tokens[:16]) == (entry, 12)  # one token must remain to prefill
    assert cache.lookup([99, *tokens]) is None
    assert cache.hits == 2 and cache.hit_tokens == 28


def test_a_longer_turn_replaces_its_prefix_and_lru_evicts_within_capacity() -> None:
    cache = PrefixCache(capacity_tokens=40, block_tokens=4)
    turn1 = list(range(10, 26))
    cache.insert(turn1, kv(16, 1.0), length=16)
    turn2 = [*turn1, 1, 2, 3, 4, 5, 6, 7, 8]
    cache.insert(turn2, kv(24, 2.0), length=24)
    assert len(cache) == 1 and cache.tokens == 24  # turn 1 is a prefix of turn 2: dropped
    cache.insert(list(range(50, 74)), kv(24, 3.0), length=24)
    assert len(cache) == 1 and cache.tokens == 24  # 48 > 40: the older entry went
    assert cache.lookup([*turn2, 9]) is None
    cache.clear()
    assert len(cache) == 0 and cache.tokens == 0


def test_multi_turn_requests_reuse_the_cache_with_exact_logprobs(
    make_engine: EngineFactory, model_dir: Path, updated_model_dir: Path
) -> None:
    engine = make_engine(prefix_block_tokens=16)
    first_input = prompt(100)
    first = engine.submit("t1", first_input, SamplingParams(max_new_tokens=24, seed=1)).result(TIMEOUT)
    assert first.cached_tokens == 0
    second_input = first_input + list(first.output_ids) + prompt(30, 7)  # + the tool's observation
    second = engine.submit("t2", second_input, SamplingParams(max_new_tokens=24, seed=2)).result(TIMEOUT)
    assert second.cached_tokens == 112  # 123 computed positions of turn 1, in blocks of 16
    reference = full_forward_logprobs(model_dir, second_input, second.output_ids)
    diffs = [abs(a - b) for a, b in zip(reference, second.output_logprobs, strict=True)]
    assert sum(diffs) / len(diffs) <= 1e-4
    assert engine.stats().prefix_hits == 1

    engine.update_weights(updated_model_dir).result(TIMEOUT)  # old keys/values are stale now
    third = engine.submit("t3", second_input, SamplingParams(max_new_tokens=4, seed=3)).result(TIMEOUT)
    assert third.cached_tokens == 0
    engine.flush_cache()
    fourth = engine.submit("t4", second_input, SamplingParams(max_new_tokens=4, seed=3)).result(TIMEOUT)
    assert fourth.cached_tokens == 0
