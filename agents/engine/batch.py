"""Request state and the decode batch of the embedded engine.

`RunningRequest` is one request's mutable state inside the engine (only the engine
thread touches it). `DecodeBatch` holds decoding requests, one row each, in one padded
KV buffer (rows × capacity positions per layer): a decode step is one batched forward
over its rows, rows shorter than the longest masked out. Rows stay compact (a finished
row is replaced by the last row), so a step's cost follows the number of running
requests; the buffer grows by doubling rows and is released when empty. `Decoder`
keeps several DecodeBatches bucketed by length so padding stays bounded.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from agents.engine.protocol import FinishReason, SamplingParams, TopLogprobs
from agents.engine.sampling import BatchSampling
from trainer.model import KVCache, ModelConfig


@dataclass(frozen=True)
class EngineResult:
    """What the engine answers for one request (the server turns it into SGLang JSON)."""

    rid: str
    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    output_versions: tuple[int, ...]
    finish_reason: FinishReason
    matched_token: int | None  # the stop token, when finish_reason is "stop"
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose keys/values came from the prefix cache
    weight_version: int
    queue_wait_s: float
    latency_s: float
    output_top_logprobs: tuple[TopLogprobs, ...] = ()  # per token, when the request asked for them


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token as it leaves the scheduler, for a streaming request's listener."""

    index: int  # position in the request's output
    token: int
    logprob: float
    version: int
    top: TopLogprobs = ()


# Called from the scheduler thread for every token of a streaming request: must be quick and
# thread-safe (the HTTP server hands the event to its loop with `call_soon_threadsafe`).
TokenListener = Callable[[TokenEvent], None]


@dataclass(eq=False)
class RunningRequest:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    seed: int
    max_new_tokens: int  # after clamping to the context cap
    arrival: float
    future: concurrent.futures.Future[EngineResult]
    admitted: float | None = None
    prefilled: int = 0  # prompt tokens whose keys/values are computed
    cached_tokens: int = 0  # of which reused from the prefix cache
    prefill_cache: KVCache | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    output_top_logprobs: list[TopLogprobs] = field(default_factory=list)
    listener: TokenListener | None = None

    @property
    def reserved_tokens(self) -> int:
        return len(self.input_ids) + self.max_new_tokens

    def same_request(self, input_ids: list[int], params: SamplingParams) -> bool:
        return self.input_ids == input_ids and self.params == params

    def append(self, token: int, logprob: float, version: int, top: TopLogprobs = ()) -> FinishReason | None:
        """Record one sampled token (and tell the listener); the finish reason when it ends the request."""
        self.output_ids.append(token)
        self.output_logprobs.append(logprob)
        self.output_versions.append(version)
        if self.params.top_logprobs:
            self.output_top_logprobs.append(top)
        if self.listener is not None:
            self.listener(TokenEvent(len(self.output_ids) - 1, token, logprob, version, top))
        if token in self.params.stop_token_ids:
            return "stop"
        if len(self.output_ids) >= self.max_new_tokens:
            return "length"
        return None

    def result(self, reason: FinishReason, version: int, now: float) -> EngineResult:
        matched = self.output_ids[-1] if reason == "stop" and self.output_ids else None
        admitted = self.admitted if self.admitted is not None else now
        return EngineResult(
            rid=self.rid,
            output_ids=tuple(self.output_ids),
            output_logprobs=tuple(self.output_logprobs),
            output_versions=tuple(self.output_versions),
            finish_reason=reason,
            matched_token=matched,
            prompt_tokens=len(self.input_ids),
            cached_tokens=self.cached_tokens,
            weight_version=version,
            queue_wait_s=admitted - self.arrival,
            latency_s=now - self.arrival,
            output_top_logprobs=tuple(self.output_top_logprobs),
        )


def request_sampling(requests: list[RunningRequest], steps: list[int]) -> BatchSampling:
    """The requests' sampling settings as one BatchSampling; `steps[i]` is row i's token index."""
    return BatchSampling.build(
        [r.params.temperature for r in requests],
        [r.params.top_p for r in requests],
        [r.params.top_k for r in requests],
        [r.seed for r in requests],
        steps,
        [r.params.top_logprobs for r in requests],
    )


class DecodeBatch:
    """Decoding requests, one row each of a padded KV buffer of fixed `capacity` positions."""

    def __init__(self, config: ModelConfig, capacity: int, dtype: torch.dtype = torch.float32) -> None:
        self.config = config
        self.capacity = capacity
        self.dtype = dtype
        self.requests: list[RunningRequest] = []
        self.lengths: list[int] = []  # tokens of each row whose keys/values are in the buffer
        self.cache: KVCache | None = None
        self._sampling: BatchSampling | None = None

    def __len__(self) -> int:
        return len(self.requests)

    def add(self, request: RunningRequest, source: KVCache, length: int) -> None:
        """Move a request in: its first `length` keys/values (row 0 of `source`) go to a new last row."""
        row = len(self.requests)
        self._ensure_rows(row + 1)
        assert self.cache is not None
        for layer in range(self.config.num_layers):
            self.cache.keys[layer][row, :, :length] = source.keys[layer][0, :, :length]
            self.cache.values[layer][row, :, :length] = source.values[layer][0, :, :length]
        self.requests.append(request)
        self.lengths.append(length)
        self._sampling = None

    def row_cache(self, row: int) -> KVCache:
        assert self.cache is not None
        return self.cache.row(row)

    def remove(self, rows: list[int]) -> None:
        """Drop rows (finished, aborted or moved); the last row moves into each hole."""
        assert self.cache is not None
        for row in sorted(rows, reverse=True):
            last = len(self.requests) - 1
            if row != last:
                length = self.lengths[last]
                for layer in range(self.config.num_layers):
                    self.cache.keys[layer][row, :, :length] = self.cache.keys[layer][last, :, :length]
                    self.cache.values[layer][row, :, :length] = self.cache.values[layer][last, :, :length]
                self.requests[row], self.lengths[row] = self.requests[last], self.lengths[last]
            self.requests.pop()
            self.lengths.pop()
        self._sampling = None
        if not self.requests:
            self.cache = None  # give the memory back while idle

    def prepare_step(self) -> tuple[torch.Tensor, torch.Tensor, KVCache, BatchSampling]:
        """Inputs of one decode step: last tokens (B, 1), their positions (B,), the cache view, sampling."""
        assert self.cache is not None and max(self.lengths) < self.capacity
        rows = len(self.requests)
        view = KVCache([k[:rows] for k in self.cache.keys], [v[:rows] for v in self.cache.values])
        tokens = torch.tensor([[r.output_ids[-1]] for r in self.requests], dtype=torch.long)
        start = torch.tensor(self.lengths, dtype=torch.long)
        if self._sampling is None:
            self._sampling = request_sampling(self.requests, [len(r.output_ids) for r in self.requests])
        return tokens, start, view, self._sampling

    def finish_step(self) -> None:
        self.lengths = [length + 1 for length in self.lengths]
        if self._sampling is not None:
            self._sampling = self._sampling.next_step()

    def _ensure_rows(self, rows: int) -> None:
        have = self.cache.rows if self.cache is not None else 0
        if rows <= have:
            return
        grown = KVCache.empty(self.config, max(rows, 2 * have), self.capacity, self.dtype)
        if self.cache is not None:
            for layer in range(self.config.num_layers):
                grown.keys[layer][:have] = self.cache.keys[layer]
                grown.values[layer][:have] = self.cache.values[layer]
        self.cache = grown


class Decoder:
    """All decoding requests, in buckets by length: each bucket is a DecodeBatch whose capacity is
    a power of two (at least `min_capacity`, at most the context cap). A row that outgrows its
    bucket moves to the next one. Padding therefore wastes at most half of each bucket, so the
    buffers stay within about twice the tokens actually cached: one long request costs its own
    length, not its length times the number of running requests."""

    def __init__(
        self,
        config: ModelConfig,
        context_length: int,
        dtype: torch.dtype = torch.float32,
        min_capacity: int = 64,
    ) -> None:
        self.config = config
        self.dtype = dtype
        self.context_length = context_length
        self.min_capacity = min_capacity
        self.buckets: dict[int, DecodeBatch] = {}

    def __len__(self) -> int:
        return sum(len(bucket) for bucket in self.buckets.values())

    def requests(self) -> list[RunningRequest]:
        return [request for bucket in self.buckets.values() for request in bucket.requests]

    def cached_positions(self) -> int:
        """Positions allocated across buckets (rows × capacity): the physical KV footprint."""
        total = 0
        for bucket in list(self.buckets.values()):
            cache = bucket.cache  # read once: the scheduler thread may release it meanwhile
            total += cache.rows * bucket.capacity if cache is not None else 0
        return total

    def capacity_for(self, positions: int) -> int:
        capacity = max(self.min_capacity, 1 << max(positions - 1, 0).bit_length())
        return min(capacity, self.context_length)

    def add(self, request: RunningRequest, source: KVCache, length: int) -> None:
        capacity = self.capacity_for(length + 1)
        bucket = self.buckets.get(capacity)
        if bucket is None:
            bucket = self.buckets[capacity] = DecodeBatch(self.config, capacity, self.dtype)
        bucket.add(request, source, length)

    def rows_of(self, rids: set[str]) -> list[tuple[RunningRequest, KVCache, int]]:
        """(request, one-row cache view, cached length) of each row in `rids`; views, no copies."""
        return [
            (request, bucket.row_cache(row), bucket.lengths[row])
            for bucket in self.buckets.values()
            for row, request in enumerate(bucket.requests)
            if request.rid in rids
        ]

    def remove_where(self, rids: set[str]) -> list[RunningRequest]:
        removed: list[RunningRequest] = []
        for bucket in self.buckets.values():
            rows = [i for i, r in enumerate(bucket.requests) if r.rid in rids]
            removed += [bucket.requests[i] for i in rows]
            if rows:
                bucket.remove(rows)
        self._drop_empty()
        return removed

    def rebucket(self) -> None:
        """Move rows whose next token would not fit their bucket into a larger one."""
        for bucket in list(self.buckets.values()):
            if max(bucket.lengths) + 1 <= bucket.capacity:
                continue
            full = [i for i, length in enumerate(bucket.lengths) if length + 1 > bucket.capacity]
            for row in full:
                self.add(bucket.requests[row], bucket.row_cache(row), bucket.lengths[row])
            if full:
                bucket.remove(full)
        self._drop_empty()

    def _drop_empty(self) -> None:
        self.buckets = {capacity: b for capacity, b in self.buckets.items() if len(b)}
