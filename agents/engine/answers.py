"""SGLang's /generate contract on the client side: the request body, and answers read into
`Generation`s (a malformed answer is an engine error, never a model answer)."""

from __future__ import annotations

import json
from typing import Any

from agents.engine.protocol import (
    EncodedIds,
    EngineError,
    FinishReason,
    Generation,
    SamplingParams,
    TopLogprobs,
)


def request_body(
    input_ids: list[int], params: SamplingParams, rid: str, stream: bool = False
) -> dict[str, Any]:
    sampling: dict[str, Any] = {
        "max_new_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "stop_token_ids": list(params.stop_token_ids),
    }
    if params.seed is not None:
        sampling["sampling_seed"] = params.seed
    body = {"input_ids": input_ids, "sampling_params": sampling, "return_logprob": True, "rid": rid}
    if params.top_logprobs:
        body["top_logprobs_num"] = params.top_logprobs
    if stream:
        body["stream"] = True
    return body


def request_bytes(input_ids: list[int], params: SamplingParams, rid: str, stream: bool = False) -> bytes:
    """`request_body` as JSON bytes; `EncodedIds` bring their own JSON text, spliced in as it is."""
    if not isinstance(input_ids, EncodedIds):
        return json.dumps(request_body(input_ids, params, rid, stream), separators=(",", ":")).encode()
    rest = json.dumps(request_body([], params, rid, stream), separators=(",", ":"))
    head = '{"input_ids":[]'
    assert rest.startswith(head)
    return ('{"input_ids":' + input_ids.json_text + rest[len(head) :]).encode()


def parse_weight_version(raw: object) -> int:
    """SGLang reports weight_version as a string ("default" until one is set)."""
    try:
        return int(str(raw))
    except ValueError:
        return 0


TokenFields = tuple[tuple[int, ...], tuple[float, ...], tuple[int, ...], tuple[TopLogprobs, ...]]


def token_fields(payload: dict[str, Any], version: int) -> TokenFields:
    """An answer's (or stream event's) output ids, logprobs, versions and top alternatives."""
    meta = payload["meta_info"]
    ids = tuple(int(t) for t in payload["output_ids"])
    logprobs = tuple(float(entry[0]) for entry in meta["output_token_logprobs"])
    versions = tuple(int(v) for v in meta.get("output_token_versions", [version] * len(ids)))
    top = tuple(
        tuple((int(alt[1]), float(alt[0])) for alt in row) for row in meta.get("output_top_logprobs") or ()
    )
    return ids, logprobs, versions, top


def finish_type(meta: dict[str, Any]) -> FinishReason:
    reason = meta["finish_reason"]["type"]
    if reason not in ("stop", "length", "abort"):
        raise ValueError(f"unknown finish_reason {reason!r}")
    return reason  # type: ignore[no-any-return]


def generation_of(
    meta: dict[str, Any], fields: TokenFields, engine_id: str, prompt_tokens: int
) -> Generation:
    ids, logprobs, versions, top = fields
    return Generation(
        output_ids=ids,
        output_logprobs=logprobs,
        output_versions=versions,
        finish_reason=finish_type(meta),
        weight_version=parse_weight_version(meta.get("weight_version")),
        engine_id=engine_id,
        prompt_tokens=int(meta.get("prompt_tokens", prompt_tokens)),
        queue_wait_s=float(meta.get("queue_time") or 0.0),
        latency_s=float(meta.get("e2e_latency") or 0.0),
        output_top_logprobs=top,
        cached_tokens=int(meta.get("cached_tokens") or 0),
    )


def parse_generation(payload: dict[str, Any], engine_id: str, prompt_tokens: int) -> Generation:
    """An SGLang /generate answer → Generation; a malformed one is an engine error."""
    try:
        meta = payload["meta_info"]
        fields = token_fields(payload, parse_weight_version(meta.get("weight_version")))
        return generation_of(meta, fields, engine_id, prompt_tokens)
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise EngineError("engine", f"malformed /generate answer: {error!r}", engine_id=engine_id) from None


def error_from_status(status: int, body: str, engine_id: str) -> EngineError:
    if status == 400 and ("context_length_exceeded" in body or "context length" in body):
        return EngineError("context", body.strip()[:500], engine_id=engine_id)
    if 400 <= status < 500 and status != 429:
        return EngineError("request", f"HTTP {status}: {body.strip()[:500]}", engine_id=engine_id)
    return EngineError("engine", f"HTTP {status}: {body.strip()[:500]}", engine_id=engine_id)
