"""Streaming /generate: server-sent events that leave as tokens are sampled.

The engine calls a request's listener from its scheduler thread with each token
(`agents.engine.batch.TokenEvent`); `TokenQueue` hands them to the HTTP loop, and
`stream_result` sends, per wake-up, one event with every token that arrived since the last
one (under load several tokens share an event), as SGLang does with
`--incremental-streaming-output`: `output_ids`, `text` and the `meta_info` logprobs,
versions and top alternatives of the new tokens only, `completion_tokens` counting all of
them, `finish_reason` null until the last event, which carries the whole request's
`meta_info` (`agents.engine.wire.generate_response`). Then `data: [DONE]`.

A client that goes away mid-stream has its request aborted (as SGLang does), so nothing
generates for nobody. An engine failure after the answer started is one last event
`{"error": {"message", "type"}}` before `[DONE]` (the status line is already sent).
A request that joined one already in flight under its rid gets its tokens with the result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
from typing import Any

from aiohttp import web
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from agents.engine.batch import EngineResult, TokenEvent
from agents.engine.engine import Engine
from agents.engine.errors import EngineFailure, EngineStopping
from agents.engine.wire import generate_response, meta_logprobs

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
DONE = b"data: [DONE]\n\n"


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class TokenQueue:
    """Tokens from the scheduler thread, then the finished result, in order, on the HTTP loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[TokenEvent | concurrent.futures.Future[EngineResult]] = asyncio.Queue()

    def listener(self, event: TokenEvent) -> None:
        self._put(event)

    def follow(self, future: concurrent.futures.Future[EngineResult]) -> None:
        """Queue `future` once done: the scheduler calls listeners before it finishes a request,
        so every token is queued before it."""
        future.add_done_callback(self._put)

    def _put(self, item: TokenEvent | concurrent.futures.Future[EngineResult]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop has closed (server shutdown): nobody listens
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)

    async def next_batch(self) -> tuple[list[TokenEvent], concurrent.futures.Future[EngineResult] | None]:
        """Every token queued now (waiting for at least one item), and the result if it came."""
        items = [await self.queue.get()]
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        done = next((i for i in items if isinstance(i, concurrent.futures.Future)), None)
        return [i for i in items if isinstance(i, TokenEvent)], done


class _Text:
    """Incremental detokenisation (a token that ends mid-character waits for the next one)."""

    def __init__(self, tokenizer: Tokenizer | None) -> None:
        self.tokenizer = tokenizer
        self.stream = DecodeStream(skip_special_tokens=False)

    def add(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return ""
        return "".join(self.stream.step(self.tokenizer, token) or "" for token in ids)


def _chunk(
    rid: str, prompt_tokens: int, events: list[TokenEvent], total: int, text: str, logprobs: bool
) -> dict[str, Any]:
    ids = [e.token for e in events]
    meta: dict[str, Any] = {
        "id": rid,
        "finish_reason": None,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": total,
        "weight_version": str(events[-1].version),
        "output_token_versions": [e.version for e in events],
    }
    if logprobs:
        tops = [e.top for e in events] if any(e.top for e in events) else []
        meta.update(meta_logprobs(ids, [e.logprob for e in events], tops))
    return {"output_ids": ids, "text": text, "meta_info": meta}


async def stream_result(
    request: web.Request,
    engine: Engine,
    rid: str,
    prompt_tokens: int,
    future: concurrent.futures.Future[EngineResult],
    tokens: TokenQueue,
    tokenizer: Tokenizer | None,
    return_logprob: bool,
) -> web.StreamResponse:
    """Send `future`'s tokens as they come (see the module docstring)."""
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    tokens.follow(future)
    text = _Text(tokenizer)
    sent = 0
    try:
        while True:
            events, done = await tokens.next_batch()
            events = [e for e in events if e.index >= sent]
            if events:
                sent += len(events)
                new_text = text.add([e.token for e in events])
                await response.write(sse(_chunk(rid, prompt_tokens, events, sent, new_text, return_logprob)))
            if done is not None:
                break
        await response.write(_last_event(done, sent, text, return_logprob))
        await response.write(DONE)
    except ConnectionResetError:
        engine.abort(rid)  # the client went away: stop generating for nobody
    except asyncio.CancelledError:
        engine.abort(rid)  # the server stops
        raise
    return response


def _last_event(
    done: concurrent.futures.Future[EngineResult], sent: int, text: _Text, return_logprob: bool
) -> bytes:
    try:
        result = done.result()
    except EngineStopping as error:
        return sse({"error": {"message": str(error), "type": "engine_stopping"}})
    except EngineFailure as error:
        return sse({"error": {"message": str(error), "type": "engine_failure"}})
    rest = list(result.output_ids[sent:])
    return sse(generate_response(result, return_logprob, text.add(rest), start=sent))
