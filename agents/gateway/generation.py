"""One engine call of a gateway session: tokens in, the reply's tokens and text out.

Without stop strings and without a streaming client the call is one plain /generate and the
text is the output decoded (stop token removed). Otherwise it uses the engine's streaming
path and reads the text as tokens arrive (`ReplyText`, incremental detokenisation):

- a stop string ends the generation where it first appears: the engine request is aborted,
  the tokens kept are those up to the one that completed the match (what the context will
  hold), and the text is cut before the string, as OpenAI cuts it;
- a streaming client gets the text as it grows (`ContentStream`), held back only where it
  could still turn out not to be content: the start of a stop string, a `<tool_call>` when
  tools are parsed, and whitespace that could end the content before one. What was sent is
  therefore always a prefix of the reply's final content.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from tokenizers.decoders import DecodeStream

from agents.chat import ChatFormat
from agents.chat_tools import OPEN
from agents.engine.protocol import Generation, GenerationChunk, SamplingParams, TopLogprobs
from agents.policy import Policy


class StreamingPolicy(Policy, Protocol):
    """A policy that can also stream (`agents.engine.client.EngineClient`)."""

    def generate_stream(
        self, input_ids: list[int], params: SamplingParams, rid: str
    ) -> AsyncGenerator[GenerationChunk | Generation, None]: ...


@dataclass(frozen=True)
class Completion:
    """The reply of one call: the tokens that stay in the context, and its text."""

    output_ids: tuple[int, ...]
    output_logprobs: tuple[float, ...]
    output_versions: tuple[int, ...]
    output_top_logprobs: tuple[TopLogprobs, ...]
    finish_reason: str  # stop | length (a stop string is "stop")
    text: str
    matched_stop: str | int | None  # the stop string, or the stop token, that ended it
    weight_version: int
    engine_id: str
    queue_wait_s: float
    cached_tokens: int


class ReplyText:
    """The reply's text as its tokens arrive, and where a stop string first appears."""

    def __init__(self, chat: ChatFormat, stops: tuple[str, ...]) -> None:
        self.chat = chat
        self.stops = stops
        self.longest = max((len(s) for s in stops), default=0)
        self.decoder = DecodeStream(skip_special_tokens=False)
        self.text = ""
        self.tokens = 0
        self.stop_at: int | None = None  # character where the matched stop string begins
        self.kept: int | None = None  # tokens through the one that completed it
        self.matched: str | None = None

    def add(self, ids: tuple[int, ...]) -> None:
        for token in ids:
            if self.stop_at is not None:
                return
            self.tokens += 1
            if token in self.chat.stop_token_ids:
                continue  # the turn's end: no text
            searched = max(0, len(self.text) - self.longest + 1)
            self.text += self.decoder.step(self.chat.tokenizer, token) or ""
            self._find_stop(searched)

    def _find_stop(self, searched: int) -> None:
        found = [(i, s) for s in self.stops if (i := self.text.find(s, searched)) >= 0]
        if found:
            self.stop_at, self.matched = min(found)
            self.kept = self.tokens

    @property
    def content(self) -> str:
        return self.text if self.stop_at is None else self.text[: self.stop_at]


class ContentStream:
    """The content a streaming client may be sent so far (see the module docstring)."""

    def __init__(self, stops: tuple[str, ...], parse_tools: bool) -> None:
        self.stops = stops
        self.parse_tools = parse_tools
        self.sent = 0

    def delta(self, text: str, final: bool = False) -> str:
        end = len(text) if final else self._safe_end(text)
        if end <= self.sent:
            return ""
        piece, self.sent = text[self.sent : end], end
        return piece

    def _safe_end(self, text: str) -> int:
        end = len(text) - max((_partial_tail(text, s) for s in self.stops), default=0)
        if self.parse_tools:
            start = text.find(OPEN)
            end = min(end, start if start >= 0 else len(text) - _partial_tail(text, OPEN))
            end = len(text[:end].rstrip())
        return end


def _partial_tail(text: str, marker: str) -> int:
    """The length of the longest end of `text` that is a proper start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


async def generate_reply(
    policy: StreamingPolicy,
    chat: ChatFormat,
    input_ids: list[int],
    params: SamplingParams,
    rid: str,
    stops: tuple[str, ...],
    on_tokens: Callable[[ReplyText], Awaitable[None]] | None,
) -> Completion:
    """Run the call (module docstring); `on_tokens` is awaited after each batch of new tokens."""
    if not stops and on_tokens is None:
        generation = await policy.generate(input_ids, params, rid)
        return _whole(generation, chat.reply_text(generation.output_ids), _stop_token(chat, generation))
    text = ReplyText(chat, stops)
    chunks: list[GenerationChunk] = []
    async with contextlib.aclosing(policy.generate_stream(input_ids, params, rid)) as items:
        async for item in items:
            if isinstance(item, Generation):
                text.add(item.output_ids[text.tokens :])  # tokens that came only with the answer
                if text.kept is not None:
                    return _cut(_joined([item]), text)
                return _whole(item, text.content, _stop_token(chat, item))
            chunks.append(item)
            text.add(item.output_ids)
            if on_tokens is not None:
                await on_tokens(text)
            if text.kept is not None:
                return _cut(_joined(chunks), text)  # leaving the stream aborts the request on the engine
    raise RuntimeError("the engine stream ended without its generation")


def _stop_token(chat: ChatFormat, generation: Generation) -> int | None:
    last = generation.output_ids[-1] if generation.output_ids else None
    return last if generation.finish_reason == "stop" and last in chat.stop_token_ids else None


def _whole(g: Generation, text: str, stop_token: int | None) -> Completion:
    return Completion(
        output_ids=g.output_ids,
        output_logprobs=g.output_logprobs,
        output_versions=g.output_versions,
        output_top_logprobs=g.output_top_logprobs,
        finish_reason=g.finish_reason,
        text=text,
        matched_stop=stop_token,
        weight_version=g.weight_version,
        engine_id=g.engine_id,
        queue_wait_s=g.queue_wait_s,
        cached_tokens=g.cached_tokens,
    )


def _joined(parts: list[GenerationChunk] | list[Generation]) -> GenerationChunk:
    return GenerationChunk(
        tuple(t for p in parts for t in p.output_ids),
        tuple(lp for p in parts for lp in p.output_logprobs),
        tuple(v for p in parts for v in p.output_versions),
        tuple(t for p in parts for t in p.output_top_logprobs),
        parts[-1].engine_id,
    )


def _cut(tokens: GenerationChunk, text: ReplyText) -> Completion:
    """The tokens through the one that completed the stop string, and the text before it."""
    kept = text.kept or 0
    versions = tokens.output_versions[:kept]
    return Completion(
        output_ids=tokens.output_ids[:kept],
        output_logprobs=tokens.output_logprobs[:kept],
        output_versions=versions,
        output_top_logprobs=tokens.output_top_logprobs[:kept],
        finish_reason="stop",
        text=text.content,
        matched_stop=text.matched,
        weight_version=versions[-1] if versions else 0,
        engine_id=tokens.engine_id,
        queue_wait_s=0.0,
        cached_tokens=0,
    )
