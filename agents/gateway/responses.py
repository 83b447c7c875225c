"""The answer as OpenAI defines it, plus what RL needs, named as vLLM and SGLang name it (pure).

`choices[0].message` (`content`, `tool_calls`), `finish_reason` (stop, length, tool_calls),
`logprobs.content` (per token: `token`, `logprob`, `bytes`, `top_logprobs`) when asked,
`usage` (with `prompt_tokens_details.cached_tokens`); `metadata.weight_version` (SGLang) on
every answer; with `return_token_ids` (vLLM, SGLang) `choices[0].prompt_token_ids` (the
context the engine was sent), `choices[0].token_ids` (its output, stop token included: the
tokens that stay in the context) and `choices[0].meta_info.output_token_versions` (ours: the
weight version of each output token). `matched_stop` (SGLang) names the stop string or token.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tokenizers.decoders import ByteLevel

from agents.chat import ChatFormat
from agents.gateway.requests import ChatRequest
from agents.gateway.session import CallResult, assistant_message


@lru_cache(maxsize=1)
def _byte_of() -> dict[str, int]:
    """GPT-2's reversible map from byte-level token characters back to bytes."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, shifted = list(kept), 0
    for byte in range(256):
        if byte not in kept:
            kept.append(byte)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(char): byte for byte, char in zip(kept, chars, strict=True)}


def token_bytes(chat: ChatFormat, token: int) -> bytes:
    """The bytes a token stands for (a byte-level token may hold part of a character)."""
    piece = chat.tokenizer.id_to_token(token) or ""
    if isinstance(chat.tokenizer.decoder, ByteLevel) and all(c in _byte_of() for c in piece):
        return bytes(_byte_of()[c] for c in piece)
    return chat.decode_exact([token]).encode()


def _entry(chat: ChatFormat, token: int, logprob: float) -> dict[str, Any]:
    raw = token_bytes(chat, token)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def logprobs_content(
    chat: ChatFormat, result: CallResult, start: int = 0, end: int | None = None
) -> list[Any]:
    """OpenAI's `logprobs.content` for output tokens [start, end) (the stop token is not content)."""
    c = result.completion
    ids = c.output_ids[start:end]
    if ids and end is None and c.finish_reason == "stop" and ids[-1] in chat.stop_token_ids:
        ids = ids[:-1]
    out = []
    for offset, token in enumerate(ids):
        index = start + offset
        entry = _entry(chat, token, c.output_logprobs[index])
        top = c.output_top_logprobs[index] if c.output_top_logprobs else ()
        entry["top_logprobs"] = [_entry(chat, alt, lp) for alt, lp in top]
        out.append(entry)
    return out


def usage(result: CallResult) -> dict[str, Any]:
    prompt, completion = result.prompt_tokens, len(result.completion.output_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": result.completion.cached_tokens},
    }


def message_body(result: CallResult) -> dict[str, Any]:
    message = assistant_message(result.reply)
    message["content"] = message["content"] or (None if result.reply.tool_calls else "")
    return message


def rl_fields(result: CallResult, request: ChatRequest) -> dict[str, Any]:
    """What a choice carries beyond OpenAI's fields."""
    fields: dict[str, Any] = {"matched_stop": result.completion.matched_stop}
    if request.return_token_ids:
        fields["prompt_token_ids"] = result.prompt_ids
        fields["token_ids"] = list(result.completion.output_ids)
        fields["meta_info"] = {"output_token_versions": list(result.completion.output_versions)}
    return fields


def completion_body(
    chat: ChatFormat, request: ChatRequest, result: CallResult, call_id: str, created: int
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": 0,
        "message": message_body(result),
        "finish_reason": result.finish_reason,
        "logprobs": {"content": logprobs_content(chat, result)} if request.logprobs else None,
        **rl_fields(result, request),
    }
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": created,
        "model": request.model,
        "choices": [choice],
        "usage": usage(result),
        "metadata": {"weight_version": str(result.completion.weight_version)},
    }


def chunk_body(
    request: ChatRequest, call_id: str, created: int, delta: dict[str, Any], **choice: Any
) -> dict[str, Any]:
    return {
        "id": call_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": request.model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **choice}],
    }
