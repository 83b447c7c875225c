"""Chat over token ids with the model's own template: rendered once, then only ever appended to.

Token in, token out: the context an episode sends to the engine is a list of ids that
grows by appending, so the trajectory's tokens are exactly what the engine received and
produced and history is never re-tokenised:

- the prompt (system and instance messages, then the assistant header) is the template's
  rendering of those two messages, tokenised once;
- each assistant turn is the engine's output ids exactly (its stop token included);
- each observation is what the template puts after an assistant message's content when a
  user (or tool) message follows: the rest of the assistant's close (`<|im_end|>\\n`, less
  the stop token the engine already produced), the new message, the next assistant header.
  It is read off the template by rendering a short probe conversation with and without the
  new message, so a template that trims or escapes content does so here too.

Templates that are not append-only (Qwen3's drops the reasoning of earlier assistant turns)
work the same way: the trajectory keeps what the engine saw, and `render_drift` measures
where a re-render of the same messages would differ, so the difference is recorded, not hidden.

Stop tokens come from the model's `generation_config.json` and the template's turn end (the
first special token of the assistant's close), never from the tokenizer's `eos_token` name:
SmolLM2's tokenizer may name `<|im_start|>` its eos while the template ends turns with
`<|im_end|>`.

OpenAI messages (the session gateway's): assistant messages may carry `tool_calls`, tool
messages a `tool_call_id`, and a request may carry `tools`. A template that renders those
itself (probed once: `native_tools`, `native_tool_calls`) gets them as transformers passes
them (arguments as objects); one that does not gets them in the Hermes convention
(`agents.chat_tools`): the tools in the system message, the calls in the assistant's
content. `continuation` appends several messages at once (tool results, then a user
message) and `render_ids` renders a whole history, once, for a session's first call or after
a client changed its history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer

from agents.chat_template import ChatTemplate, ChatTemplateError, Message, special_tokens_of
from agents.chat_tools import tool_calls_text, tools_prompt
from streams.payloads import RenderDrift
from trainer.checkpoint import CHAT_TEMPLATE, chat_template_text, generation_eos_ids, tokenizer_config
from trainer.tokenizer import ENDOFTEXT, IM_END, load_tokenizer, special_token_ids

# Probe texts: distinct, free of template syntax, unlikely in any template's own text.
PROBE_SYSTEM = "PROBE-SYSTEM-7f3a"
PROBE_USER = "PROBE-USER-7f3a"
PROBE_ASSISTANT = "PROBE-ASSISTANT-7f3a"
DRIFT_EXCERPT_CHARS = 80


PROBE_HEAD: list[Message] = [
    {"role": "system", "content": PROBE_SYSTEM},
    {"role": "user", "content": PROBE_USER},
    {"role": "assistant", "content": PROBE_ASSISTANT},
]
PROBE_TOOL_NAME = "probe_tool_7f3a"
PROBE_TOOL = {
    "type": "function",
    "function": {"name": PROBE_TOOL_NAME, "description": "probe", "parameters": {"type": "object"}},
}
PROBE_CALL = {"id": "call_probe", "type": "function", "function": {"name": PROBE_TOOL_NAME, "arguments": {}}}


def _message(role: str, content: str) -> Message:
    message: Message = {"role": role, "content": content}
    if role == "tool":
        message["tool_call_id"] = "call_0"
    return message


def assistant_close(template: ChatTemplate) -> str:
    """What the template writes after an assistant message's content, e.g. "<|im_end|>\n"."""
    before = template.render(PROBE_HEAD)
    if PROBE_ASSISTANT not in before:
        raise ChatTemplateError("the template does not render an assistant message's content")
    return before[before.rindex(PROBE_ASSISTANT) + len(PROBE_ASSISTANT) :]


def turn_after_assistant(template: ChatTemplate, messages: list[Message], before: str | None = None) -> str:
    """The text the template appends for `messages` after an assistant message, through the next
    assistant header (rendered with the real contents, so a template that trims, escapes or groups
    them does so here too). `before`: the template's rendering of `PROBE_HEAD`, when the caller has it."""
    before = template.render(PROBE_HEAD) if before is None else before
    after = template.render([*PROBE_HEAD, *messages], add_generation_prompt=True)
    if not after.startswith(before):
        roles = ", ".join(str(m.get("role")) for m in messages)
        raise ChatTemplateError(
            f"the template re-renders earlier messages when ({roles}) follow an assistant message; "
            "its turns cannot be appended"
        )
    return after[len(before) :]


@dataclass(frozen=True)
class ChatFormat:
    """A model's tokenizer, chat template and stop tokens."""

    tokenizer: Tokenizer
    template: ChatTemplate
    eos_ids: tuple[int, ...] = ()

    @classmethod
    def from_model_dir(cls, path: Path) -> ChatFormat:
        config = tokenizer_config(path)
        template = ChatTemplate(chat_template_text(path), special_tokens_of(config))
        return cls(load_tokenizer(path), template, generation_eos_ids(path))

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> ChatFormat:
        """Our own tokenizer (`trainer.tokenizer`) with its ChatML template."""
        ids = special_token_ids(tokenizer)
        return cls(tokenizer, ChatTemplate(CHAT_TEMPLATE), (ids[IM_END], ids[ENDOFTEXT]))

    @cached_property
    def close(self) -> str:
        """What the template writes after an assistant message's content."""
        return assistant_close(self.template)

    @cached_property
    def _probe_head(self) -> str:
        return self.template.render(PROBE_HEAD)

    @cached_property
    def turn_end_id(self) -> int | None:
        """The token that ends an assistant turn: the first token of the template's close when it
        is a special token (`<|im_end|>`, `<|eot_id|>`), else the first eos id."""
        close_ids = self.encode(self.close)
        specials = {i for i, token in self.tokenizer.get_added_tokens_decoder().items() if token.special}
        if close_ids and close_ids[0] in specials:
            return close_ids[0]
        return self.eos_ids[0] if self.eos_ids else None

    @property
    def turn_end(self) -> tuple[int, ...]:
        """`turn_end_id` as a tuple: what a scripted reply ends with (empty when the model has none)."""
        return () if self.turn_end_id is None else (self.turn_end_id,)

    @cached_property
    def stop_token_ids(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((*self.turn_end, *self.eos_ids)))

    def encode(self, text: str) -> list[int]:
        """Text to ids as transformers tokenises a rendered chat: special-token strings are specials,
        no BOS/EOS added (the template writes those)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        """Readable text, special tokens dropped (what the scripted expert reads)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def decode_exact(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def prompt(self, system: str, instance: str) -> list[int]:
        """The first context: system and instance messages, then the assistant header."""
        messages = [{"role": "system", "content": system}, {"role": "user", "content": instance}]
        return self.encode(self.template.render(messages, add_generation_prompt=True))

    def observation(self, previous_output: Sequence[int], content: str, role: str = "user") -> list[int]:
        """Ids appended after `previous_output` to show `content` as the next `role` turn: the rest of
        the assistant's close (less the stop token the engine produced), then the template's turn."""
        return self.continuation(previous_output, [_message(role, content)])

    def continuation(self, previous_output: Sequence[int], messages: list[Message]) -> list[int]:
        """Ids appended after `previous_output` to show `messages` (e.g. tool results, then a user
        message): the rest of the assistant's close, then the template's turns through the next
        assistant header. Costs one render of a few messages, whatever the history's length."""
        close = self.close
        stop = previous_output[-1] if previous_output else None
        if stop is not None and stop in self.stop_token_ids:
            stop_text = self.decode_exact([stop])
            close = close[len(stop_text) :] if close.startswith(stop_text) else close
        turns = turn_after_assistant(self.template, self.template_messages(messages), self._probe_head)
        return self.encode(close + turns)

    # ---- OpenAI tools ----

    @cached_property
    def native_tools(self) -> bool:
        """Whether the template renders OpenAI `tools` itself (Qwen's do; SmolLM2's does not)."""
        head = PROBE_HEAD[:2]
        try:
            return self.template.render(head, tools=[PROBE_TOOL]) != self.template.render(head)
        except ChatTemplateError:
            return False

    @cached_property
    def native_tool_calls(self) -> bool:
        """Whether the template renders an assistant message's `tool_calls` itself."""
        call = {"role": "assistant", "content": PROBE_ASSISTANT, "tool_calls": [PROBE_CALL]}
        try:
            return PROBE_TOOL_NAME in self.template.render([*PROBE_HEAD[:2], call])
        except ChatTemplateError:
            return False

    def template_messages(self, messages: list[Message], tools: list[Message] | None = None) -> list[Message]:
        """OpenAI messages as this template takes them (see the module docstring)."""
        out: list[Message] = []
        for message in messages:
            message = {**message, "content": message.get("content") or ""}
            calls = message.pop("tool_calls", None)
            if calls and self.native_tool_calls:
                message["tool_calls"] = [_with_object_arguments(call) for call in calls]
            elif calls:
                message["content"] = tool_calls_text(message["content"], calls)
            out.append(message)
        if tools and not self.native_tools:
            if out and out[0].get("role") == "system":
                out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{tools_prompt(tools)}"}
            else:
                out.insert(0, {"role": "system", "content": tools_prompt(tools)})
        return out

    def render_text(
        self, messages: list[Message], tools: list[Message] | None = None, add_generation_prompt: bool = True
    ) -> str:
        """The template's rendering of OpenAI `messages` (and `tools`)."""
        native = tools if tools and self.native_tools else None
        rendered = self.template_messages(messages, tools)
        return self.template.render(rendered, add_generation_prompt=add_generation_prompt, tools=native)

    def render_ids(self, messages: list[Message], tools: list[Message] | None = None) -> list[int]:
        """A whole history through the next assistant header, tokenised: a session's first context."""
        return self.encode(self.render_text(messages, tools))

    def reply_text(self, output_ids: Sequence[int]) -> str:
        """The assistant message's content: the output less its final stop token, specials kept."""
        ids = list(output_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return self.decode_exact(ids)

    def render_drift(
        self, pieces: Sequence[Sequence[int]], messages: list[Message], tools: list[Message] | None = None
    ) -> RenderDrift | None:
        """Compare the context the engine saw (`pieces`: prompt, output 1, observation 1, output 2,
        ...) with the template's rendering of `messages`; None when they agree."""
        seen = self.decode_exact([t for piece in pieces for t in piece])
        ends_in_output = len(pieces) % 2 == 0
        rendered = self.render_text(messages, tools, add_generation_prompt=not ends_in_output)
        if ends_in_output:  # the re-render closes the last assistant message; the context is not closed yet
            rendered = rendered.removesuffix(self.close)
            last = pieces[-1]
            if last and last[-1] in self.stop_token_ids:
                seen = seen.removesuffix(self.decode_exact([last[-1]]))
        if seen == rendered:
            return None
        offset = next((i for i, (a, b) in enumerate(zip(seen, rendered, strict=False)) if a != b), None)
        offset = min(len(seen), len(rendered)) if offset is None else offset
        ends, total = [], 0
        for piece in pieces:
            total += len(self.decode_exact(piece))
            ends.append(total)
        index = next((i for i, end in enumerate(ends) if offset < end), len(pieces) - 1)
        return RenderDrift(
            turn=(index + 1) // 2,
            offset=offset,
            seen=seen[offset : offset + DRIFT_EXCERPT_CHARS],
            rendered=rendered[offset : offset + DRIFT_EXCERPT_CHARS],
        )


def _with_object_arguments(call: dict[str, object]) -> dict[str, object]:
    """An OpenAI tool call with its arguments as an object (templates `tojson` them; vLLM does the same)."""
    function = call.get("function")
    if isinstance(function, dict) and isinstance(function.get("arguments"), str):
        text = function["arguments"]
        arguments = json.loads(text) if text.strip() else {}
        return {**call, "function": {**function, "arguments": arguments}}
    return call
