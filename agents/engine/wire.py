"""SGLang's /generate answer for an `EngineResult`: `output_ids`, `text` and `meta_info`.

One copy of the JSON both the plain answer (`agents.engine.server`) and the last event of a
stream (`agents.engine.streaming`) send; see the server's docstring for the fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agents.engine.batch import EngineResult
from agents.engine.protocol import TopLogprobs


def finish_reason_json(result: EngineResult) -> dict[str, Any]:
    if result.finish_reason == "stop":
        return {"type": "stop", "matched": result.matched_token}
    if result.finish_reason == "length":
        return {"type": "length", "length": len(result.output_ids)}
    return {"type": "abort", "message": "Abort request"}


def meta_logprobs(
    ids: Sequence[int], logprobs: Sequence[float], top: Sequence[TopLogprobs]
) -> dict[str, list[Any]]:
    """`output_token_logprobs` ([logprob, token_id, null] per token) and, when asked,
    `output_top_logprobs` (per token, [logprob, token_id, null] per alternative), as SGLang."""
    meta: dict[str, list[Any]] = {
        "output_token_logprobs": [[lp, token, None] for lp, token in zip(logprobs, ids, strict=True)]
    }
    if top:
        meta["output_top_logprobs"] = [[[lp, token, None] for token, lp in row] for row in top]
    return meta


def generate_response(
    result: EngineResult, return_logprob: bool, text: str, start: int = 0
) -> dict[str, Any]:
    """The answer for `result`; with `start`, its tokens from `start` on (the last event of an
    incremental stream), while the counts stay the whole request's."""
    meta: dict[str, Any] = {
        "id": result.rid,
        "finish_reason": finish_reason_json(result),
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.output_ids),
        "cached_tokens": result.cached_tokens,
        "weight_version": str(result.weight_version),
        "output_token_versions": list(result.output_versions[start:]),
        "queue_time": result.queue_wait_s,
        "e2e_latency": result.latency_s,
    }
    if return_logprob:
        top = result.output_top_logprobs[start:]
        meta.update(meta_logprobs(result.output_ids[start:], result.output_logprobs[start:], top))
    return {"output_ids": list(result.output_ids[start:]), "text": text, "meta_info": meta}
