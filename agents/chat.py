"""Chat over token ids: the ChatML layout, built once and only ever appended to.

Token in, token out: the context an episode sends to the engine is a list of ids
that grows by appending (the engine's output ids exactly as generated, then the
observation ids of the next user turn). History is never re-tokenised, so the
trajectory's tokens are exactly what the engine received and produced.

Layout (ChatML, as the policy model's tokenizer defines it):

    <|im_start|>system\\n{system}<|im_end|>\\n
    <|im_start|>user\\n{instance}<|im_end|>\\n
    <|im_start|>assistant\\n            <- prompt ends here; the engine generates
    {reply}<|im_end|>                  <- output ids (the stop token is part of the output)
    \\n<|im_start|>user\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n   <- observation ids

If a reply stopped without `<|im_end|>` (length cap), the observation starts by
closing the assistant turn, so the layout stays well-formed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from tokenizers import Tokenizer

from trainer.tokenizer import ENDOFTEXT, IM_END, IM_START, special_token_ids


@dataclass(frozen=True)
class ChatFormat:
    """ChatML pieces as token ids for one tokenizer."""

    tokenizer: Tokenizer
    im_start: int
    im_end: int
    endoftext: int

    @classmethod
    def for_tokenizer(cls, tokenizer: Tokenizer) -> ChatFormat:
        ids = special_token_ids(tokenizer)
        return cls(tokenizer, ids[IM_START], ids[IM_END], ids[ENDOFTEXT])

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        return (self.im_end, self.endoftext)

    def encode(self, text: str) -> list[int]:
        """Plain text to ids; special-token strings inside `text` are not treated as special."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    @cached_property
    def _newline(self) -> tuple[int, ...]:
        return tuple(self.encode("\n"))

    @cached_property
    def _assistant_header(self) -> tuple[int, ...]:
        return (self.im_start, *self.encode("assistant\n"))

    def message(self, role: str, content: str) -> list[int]:
        return [self.im_start, *self.encode(f"{role}\n{content}"), self.im_end, *self._newline]

    def prompt(self, system: str, instance: str) -> list[int]:
        """The first context: system and instance messages, then the assistant header."""
        return [*self.message("system", system), *self.message("user", instance), *self._assistant_header]

    def observation(self, previous_output: Sequence[int], content: str) -> list[int]:
        """Ids appended after `previous_output` to show `content` as the next user turn."""
        closing = [] if previous_output and previous_output[-1] == self.im_end else [self.im_end]
        return [*closing, *self._newline, *self.message("user", content), *self._assistant_header]

    def reply_text(self, output_ids: Sequence[int]) -> str:
        """The assistant's reply as text (stop tokens dropped)."""
        return self.decode([t for t in output_ids if t not in self.stop_token_ids])
