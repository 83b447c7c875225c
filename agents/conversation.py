"""An episode's context: token ids that only grow, kept with the messages they render.

`Conversation` is what an episode sends to the engine: the prompt, then each turn's output
ids exactly as the engine produced them, then the observation ids `ChatFormat.observation`
appends. It keeps the same context as the template's pieces and as chat messages, so
`drift()` can say where a re-render of those messages by the template would differ from
what the engine saw (`ChatFormat.render_drift`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agents.chat import ChatFormat
from agents.chat_template import ChatTemplateError, Message
from streams.payloads import RenderDrift


@dataclass
class Conversation:
    chat: ChatFormat
    ids: list[int] = field(default_factory=list)
    pieces: list[list[int]] = field(default_factory=list)  # prompt, output, observation, output, ...
    messages: list[Message] = field(default_factory=list)
    pending_observation: list[int] = field(default_factory=list)  # appended, not yet on an event

    @classmethod
    def start(cls, chat: ChatFormat, system: str, instance: str) -> Conversation:
        prompt = chat.prompt(system, instance)
        messages: list[Message] = [
            {"role": "system", "content": system},
            {"role": "user", "content": instance},
        ]
        return cls(chat, list(prompt), [list(prompt)], messages)

    @property
    def prompt(self) -> list[int]:
        return self.pieces[0]

    @property
    def turns(self) -> int:
        return sum(1 for message in self.messages if message["role"] == "assistant")

    def __len__(self) -> int:
        return len(self.ids)

    def add_output(self, output_ids: Sequence[int]) -> None:
        """The engine's output of one turn, exactly as produced."""
        self.ids.extend(output_ids)
        self.pieces.append(list(output_ids))
        self.messages.append({"role": "assistant", "content": self.chat.reply_text(output_ids)})

    def add_observation(self, content: str, role: str = "user") -> list[int]:
        """Show `content` as the next `role` turn; returns the appended ids (also kept as pending)."""
        ids = self.chat.observation(self.pieces[-1], content, role)
        self.ids.extend(ids)
        self.pieces.append(ids)
        self.messages.append({"role": role, "content": content})
        self.pending_observation = ids
        return ids

    def take_pending_observation(self) -> list[int]:
        """The observation ids appended since the last turn event (they go on the next one)."""
        ids, self.pending_observation = self.pending_observation, []
        return ids

    def drift(self) -> RenderDrift | None:
        """Where a re-render of the messages differs from the ids the engine saw (None: nowhere)."""
        if self.turns == 0:
            return None
        try:
            return self.chat.render_drift(self.pieces, self.messages)
        except ChatTemplateError as error:  # the template refuses its own history: say so
            return RenderDrift(turn=self.turns, offset=0, seen="", rendered=f"re-render failed: {error}")
