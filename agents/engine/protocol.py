"""What crosses the boundary between the agent scaffold and an inference engine.

`SamplingParams` and `Generation` are the engine-neutral request and answer: the
`EngineClient` maps them to and from SGLang's `/generate` contract, so the scaffold
never sees HTTP. `EngineError` is an infrastructure failure, never a model answer:

- kind "network": the engine could not be reached (connection refused/reset, DNS,
  connect timeout). Retried by the client per `ClientSettings`.
- kind "engine": the engine was reached but failed (5xx, malformed answer, no answer
  before the timeout). Retried per `ClientSettings`.
- kind "context": the engine refused the input because it is at or over its context
  cap (HTTP 400). Not retried; the scaffold records the episode as `truncated:context`.
- kind "request": any other 4xx: our request was wrong. Not retried.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort"]
EngineErrorKind = Literal["engine", "network", "context", "request"]
# One token's most likely alternatives: (token id, logprob) pairs, most likely first.
TopLogprobs = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. `top_k <= 0` and `top_p >= 1` disable those filters;
    `temperature == 0` is greedy. `seed=None` lets the engine pick one."""

    max_new_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    top_logprobs: int = 0  # alternatives returned per token (SGLang's top_logprobs_num); 0 = none

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {self.top_logprobs}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))


@dataclass(frozen=True)
class Generation:
    """One completion: the sampled tokens, their logprobs (under the sampling temperature,
    before top-k/top-p) and the weight version that produced each token."""

    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    output_versions: tuple[int, ...]
    finish_reason: FinishReason
    weight_version: int
    engine_id: str
    prompt_tokens: int
    queue_wait_s: float
    latency_s: float
    output_top_logprobs: tuple[TopLogprobs, ...] = ()  # per token, when `SamplingParams.top_logprobs` > 0
    cached_tokens: int = 0  # prompt tokens the engine's prefix cache served

    def __post_init__(self) -> None:
        _check_lengths(self.output_ids, self.output_logprobs, self.output_versions, self.output_top_logprobs)


@dataclass(frozen=True)
class GenerationChunk:
    """Tokens of a streaming generation as they arrive (`EngineClient.generate_stream`), in order;
    the stream ends with the whole `Generation`."""

    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    output_versions: tuple[int, ...]
    output_top_logprobs: tuple[TopLogprobs, ...] = ()
    engine_id: str = ""

    def __post_init__(self) -> None:
        _check_lengths(self.output_ids, self.output_logprobs, self.output_versions, self.output_top_logprobs)


def _check_lengths(
    ids: tuple[int, ...], logprobs: tuple[float, ...], versions: tuple[int, ...], top: tuple[TopLogprobs, ...]
) -> None:
    if not len(ids) == len(logprobs) == len(versions) or (top and len(top) != len(ids)):
        raise ValueError(
            f"output_ids ({len(ids)}), output_logprobs ({len(logprobs)}), output_versions "
            f"({len(versions)}) and output_top_logprobs ({len(top)}, or none) must have the same length"
        )


class EncodedIds(list[int]):
    """Token ids that carry their JSON array text, built by whoever grows them a piece at a time
    (`agents.conversation.Conversation.encoded_ids`), so that a long context is not encoded again
    for every request: the client splices the text into the request body as it is."""

    def __init__(self, ids: list[int], json_text: str) -> None:
        super().__init__(ids)
        self.json_text = json_text


class EngineError(Exception):
    """An inference request that failed for a reason that is not the model's answer."""

    def __init__(
        self, kind: EngineErrorKind, message: str, *, engine_id: str = "", injected: bool = False
    ) -> None:
        super().__init__(f"[{kind}] {engine_id + ': ' if engine_id else ''}{message}")
        self.kind: EngineErrorKind = kind
        self.message = message
        self.engine_id = engine_id
        self.injected = injected  # caused by `client.faults` (agents/engine/faults.py), not the engine

    @property
    def retryable(self) -> bool:
        return self.kind in ("engine", "network")
