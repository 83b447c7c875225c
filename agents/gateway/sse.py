"""A streaming chat completion: OpenAI's `chat.completion.chunk` server-sent events.

The first chunk (`delta.role`) leaves with the first tokens the engine samples, content
chunks as the text grows (`ContentStream` holds back what could still be a stop string or a
tool call), then any tool calls (one delta each, whole), a last chunk with `finish_reason`
(and the logprobs and token ids when asked), a usage chunk when `stream_options.include_usage`,
and `data: [DONE]`. A call refused or failed before its first token gets a plain error
response with its status; one that fails after the stream began gets an error event.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from agents.chat import ChatFormat
from agents.gateway.errors import OpenAIError
from agents.gateway.generation import ContentStream, ReplyText
from agents.gateway.requests import ChatRequest
from agents.gateway.responses import chunk_body, logprobs_content, rl_fields, usage
from agents.gateway.session import CallResult

HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class CompletionStream:
    def __init__(
        self, http: web.Request, chat: ChatFormat, request: ChatRequest, call_id: str, created: int
    ) -> None:
        self.http = http
        self.chat = chat
        self.request = request
        self.call_id = call_id
        self.created = created
        self.content = ContentStream(request.stop, request.parse_tools)
        self.response: web.StreamResponse | None = None
        self.sent = ""  # content sent so far

    async def _send(self, delta: dict[str, Any], **choice: Any) -> None:
        body = chunk_body(self.request, self.call_id, self.created, delta, **choice)
        if self.request.include_usage:
            body["usage"] = None
        assert self.response is not None
        await self.response.write(event(body))

    async def _start(self) -> None:
        if self.response is None:
            self.response = web.StreamResponse(headers=HEADERS)
            await self.response.prepare(self.http)
            await self._send({"role": "assistant", "content": ""})

    async def on_tokens(self, text: ReplyText) -> None:
        await self._start()
        piece = self.content.delta(text.content)
        if piece:
            self.sent += piece
            await self._send({"content": piece})

    async def finish(self, result: CallResult) -> web.StreamResponse:
        await self._start()
        final = result.reply.content
        if final.startswith(self.sent) and len(final) > len(self.sent):
            await self._send({"content": final[len(self.sent) :]})
        for index, call in enumerate(result.reply.tool_calls):
            await self._send({"tool_calls": [{"index": index, **call.openai()}]})
        logprobs = {"content": logprobs_content(self.chat, result)} if self.request.logprobs else None
        await self._send(
            {}, finish_reason=result.finish_reason, logprobs=logprobs, **rl_fields(result, self.request)
        )
        if self.request.include_usage:
            body = chunk_body(self.request, self.call_id, self.created, {})
            body["choices"] = []
            body["usage"] = usage(result)
            body["metadata"] = {"weight_version": str(result.completion.weight_version)}
            assert self.response is not None
            await self.response.write(event(body))
        return await self._done()

    async def fail(self, error: OpenAIError) -> web.StreamResponse:
        if self.response is None:
            return web.json_response(error.body(), status=error.status)
        await self.response.write(event(error.body()))
        return await self._done()

    async def _done(self) -> web.StreamResponse:
        assert self.response is not None
        await self.response.write(b"data: [DONE]\n\n")
        await self.response.write_eof()
        return self.response
