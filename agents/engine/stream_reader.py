"""Reading a streaming /generate answer: server-sent events → `GenerationChunk`s, then the `Generation`.

Both of SGLang's stream forms are read: incremental events (each carries the tokens new since
the previous one: our engine, SGLang with `--incremental-streaming-output`) and cumulative ones
(each carries every token so far: SGLang's default). An event is cumulative when its
`output_ids` are as many as its `meta_info.completion_tokens`; only the tokens beyond those
already seen are new. The event whose `finish_reason` is set ends the generation.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp

from agents.engine.answers import generation_of, parse_weight_version, token_fields
from agents.engine.protocol import EngineError, Generation, GenerationChunk, TopLogprobs

END = b"[DONE]"


async def sse_data(content: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """The `data:` payloads of a server-sent event stream (events of any size), until `[DONE]`."""
    buffer = b""
    async for piece in content.iter_any():
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            data = b"".join(line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:"))
            if data == END:
                return
            if data:
                yield data


class StreamAccumulator:
    """One generation's stream events folded: `add` returns the new tokens, and the whole
    generation once an event finishes it."""

    def __init__(self, engine_id: str, prompt_tokens: int) -> None:
        self.engine_id = engine_id
        self.prompt_tokens = prompt_tokens
        self.ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.top: list[TopLogprobs] = []

    def add(self, payload: dict[str, Any]) -> tuple[GenerationChunk | None, Generation | None]:
        if "error" in payload:
            error = payload["error"]
            message = error.get("message", "") if isinstance(error, dict) else str(error)
            raise EngineError("engine", f"the stream ended in an error: {message}", engine_id=self.engine_id)
        try:
            return self._add(payload)
        except (KeyError, TypeError, ValueError, IndexError) as error:
            message = f"malformed /generate stream event: {error!r}"
            raise EngineError("engine", message, engine_id=self.engine_id) from None

    def _add(self, payload: dict[str, Any]) -> tuple[GenerationChunk | None, Generation | None]:
        meta = payload["meta_info"]
        ids, logprobs, versions, top = token_fields(payload, parse_weight_version(meta.get("weight_version")))
        total = meta.get("completion_tokens")
        skip = len(self.ids) if total is not None and len(ids) == int(total) else 0  # cumulative event
        chunk = None
        if len(ids) > skip:
            chunk = GenerationChunk(ids[skip:], logprobs[skip:], versions[skip:], top[skip:], self.engine_id)
            self.ids += chunk.output_ids
            self.logprobs += chunk.output_logprobs
            self.versions += chunk.output_versions
            self.top += chunk.output_top_logprobs
        if meta.get("finish_reason") is None:
            return chunk, None
        fields = (tuple(self.ids), tuple(self.logprobs), tuple(self.versions), tuple(self.top))
        return chunk, generation_of(meta, fields, self.engine_id, self.prompt_tokens)


def decode_event(data: bytes, engine_id: str) -> dict[str, Any]:
    try:
        payload = json.loads(data)
    except ValueError as error:
        raise EngineError("engine", f"unreadable stream event: {error}", engine_id=engine_id) from None
    if not isinstance(payload, dict):
        raise EngineError("engine", "a stream event is not a JSON object", engine_id=engine_id)
    return payload
