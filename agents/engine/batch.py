"""Request state and the decode batch of the embedded engine.

`RunningRequest` is one request's mutable state inside the engine (only the engine
thread touches it). `DecodeBatch` holds the requests that are decoding, one row each,
in one padded KV buffer (rows × positions per layer): a decode step is one batched
forward over all rows, rows shorter than the longest masked out. Rows stay compact
(a finished row is replaced by the last row), so the step's cost follows the number
of running requests, and the buffer grows by doubling and is released when empty.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field

import torch

from agents.engine.protocol import FinishReason, SamplingParams
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
    weight_version: int
    queue_wait_s: float
    latency_s: float


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
    prefill_cache: KVCache | None = None
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)

    @property
    def reserved_tokens(self) -> int:
        return len(self.input_ids) + self.max_new_tokens

    def same_request(self, input_ids: list[int], params: SamplingParams) -> bool:
        return self.input_ids == input_ids and self.params == params

    def append(self, token: int, logprob: float, version: int) -> FinishReason | None:
        """Record one sampled token; the finish reason when it ends the request."""
        self.output_ids.append(token)
        self.output_logprobs.append(logprob)
        self.output_versions.append(version)
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
            weight_version=version,
            queue_wait_s=admitted - self.arrival,
            latency_s=now - self.arrival,
        )


class DecodeBatch:
    """Decoding requests, one row each of a shared padded KV buffer."""

    def __init__(self, config: ModelConfig, max_positions: int, dtype: torch.dtype = torch.float32) -> None:
        self.config = config
        self.max_positions = max_positions
        self.dtype = dtype
        self.requests: list[RunningRequest] = []
        self.lengths: list[int] = []  # tokens of each row whose keys/values are in the buffer
        self.cache: KVCache | None = None
        self._sampling: BatchSampling | None = None

    def __len__(self) -> int:
        return len(self.requests)

    def add(self, request: RunningRequest, prefill_cache: KVCache, length: int) -> None:
        """Move a prefilled request in: its keys/values are copied into a new last row."""
        row = len(self.requests)
        self._ensure(rows=row + 1, positions=length + 1)
        assert self.cache is not None
        for layer in range(self.config.num_layers):
            self.cache.keys[layer][row, :, :length] = prefill_cache.keys[layer][0, :, :length]
            self.cache.values[layer][row, :, :length] = prefill_cache.values[layer][0, :, :length]
        self.requests.append(request)
        self.lengths.append(length)
        self._sampling = None

    def remove(self, rows: list[int]) -> None:
        """Drop rows (finished or aborted); the last row moves into each hole."""
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
        self._ensure(rows=len(self.requests), positions=max(self.lengths) + 1)
        assert self.cache is not None
        rows = len(self.requests)
        view = KVCache([k[:rows] for k in self.cache.keys], [v[:rows] for v in self.cache.values])
        tokens = torch.tensor([[r.output_ids[-1]] for r in self.requests], dtype=torch.long)
        start = torch.tensor(self.lengths, dtype=torch.long)
        if self._sampling is None:
            self._sampling = BatchSampling.build(
                [r.params.temperature for r in self.requests],
                [r.params.top_p for r in self.requests],
                [r.params.top_k for r in self.requests],
                [r.seed for r in self.requests],
                [len(r.output_ids) for r in self.requests],
            )
        return tokens, start, view, self._sampling

    def finish_step(self) -> None:
        self.lengths = [length + 1 for length in self.lengths]
        if self._sampling is not None:
            self._sampling = BatchSampling(
                self._sampling.temperature,
                self._sampling.top_p,
                self._sampling.top_k,
                self._sampling.seed,
                self._sampling.step + 1,
            )

    def _ensure(self, rows: int, positions: int) -> None:
        """Grow the buffer (doubling, positions capped at max_positions) to hold rows × positions."""
        if positions > self.max_positions:
            raise ValueError(f"a row needs {positions} positions, over the engine's {self.max_positions}")
        have_rows = self.cache.rows if self.cache is not None else 0
        have_positions = self.cache.capacity if self.cache is not None else 0
        if rows <= have_rows and positions <= have_positions:
            return
        new_rows = max(rows, 2 * have_rows) if rows > have_rows else have_rows
        new_positions = max(have_positions, 16)
        while new_positions < positions:
            new_positions *= 2
        new_positions = min(new_positions, self.max_positions)
        grown = KVCache.empty(self.config, new_rows, new_positions, self.dtype)
        if self.cache is not None:
            for layer in range(self.config.num_layers):
                grown.keys[layer][:have_rows, :, :have_positions] = self.cache.keys[layer]
                grown.values[layer][:have_rows, :, :have_positions] = self.cache.values[layer]
        self.cache = grown
