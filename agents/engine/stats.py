"""`EngineStats`: a snapshot of the embedded engine's scheduler (`Engine.stats()`): requests running,
prefilling and queued, the KV budget, the prefix cache, the weight version and counters; the
server serves it as `/engine_stats` and checks its liveness with it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineStats:
    running: int
    prefilling: int
    queued: int
    reserved_kv_tokens: int
    kv_cache_tokens: int
    cached_kv_positions: int  # allocated in decode buffers (rows × bucket capacity)
    prefix_cache_tokens: int
    prefix_hits: int
    prefix_hit_tokens: int
    weight_version: int
    paused: bool
    decode_steps: int
    generated_tokens: int
