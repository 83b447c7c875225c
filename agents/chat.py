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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from tokenizers import Tokenizer

from agents.chat_template import ChatTemplate, ChatTemplateError, Message, special_tokens_of
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


def turn_after_assistant(template: ChatTemplate, role: str, content: str, before: str | None = None) -> str:
    """The text the template appends for a `role` message after an assistant one, through the next
    assistant header (rendered with the real content, so a template that trims or escapes it does
    so here too). `before`: the template's rendering of `PROBE_HEAD`, when the caller has it."""
    before = template.render(PROBE_HEAD) if before is None else before
    after = template.render([*PROBE_HEAD, _message(role, content)], add_generation_prompt=True)
    if not after.startswith(before):
        raise ChatTemplateError(
            f"the template re-renders earlier messages when a {role} message follows an assistant one; "
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
        close = self.close
        stop = previous_output[-1] if previous_output else None
        if stop is not None and stop in self.stop_token_ids:
            stop_text = self.decode_exact([stop])
            close = close[len(stop_text) :] if close.startswith(stop_text) else close
        return self.encode(close + turn_after_assistant(self.template, role, content, self._probe_head))

    def reply_text(self, output_ids: Sequence[int]) -> str:
        """The assistant message's content: the output less its final stop token, specials kept."""
        ids = list(output_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return self.decode_exact(ids)

    def render_drift(self, pieces: Sequence[Sequence[int]], messages: list[Message]) -> RenderDrift | None:
        """Compare the context the engine saw (`pieces`: prompt, output 1, observation 1, output 2,
        ...) with the template's rendering of `messages`; None when they agree."""
        seen = self.decode_exact([t for piece in pieces for t in piece])
        ends_in_output = len(pieces) % 2 == 0
        rendered = self.template.render(messages, add_generation_prompt=not ends_in_output)
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
