"""An episode's context: token ids that only grow, kept with the messages they render.

`Conversation` is what an episode sends to the engine: the prompt, then each turn's output
ids exactly as the engine produced them, then the observation ids `ChatFormat.observation`
appends. It keeps the same context as the template's pieces and as chat messages, so
`drift()` can say where a re-render of those messages by the template would differ from
what the engine saw (`ChatFormat.render_drift`).

A gateway session's conversation starts from a client's messages (`from_messages`: its
prompt is also the first turn's observation), appends several messages at a time
(`add_messages`: tool results, then a user message), and when a client's history is not an
extension of what the engine saw, `rebase` re-renders it from the messages and says how much
of the old context is kept (`HistoryDrift`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from agents.chat import ChatFormat
from agents.chat_template import ChatTemplateError, Message
from agents.engine.protocol import EncodedIds
from streams.payloads import HistoryDrift, RenderDrift


@dataclass(frozen=True)
class Checkpoint:
    ids: list[int]
    ids_len: int
    pieces: list[list[int]]
    pieces_len: int
    messages: list[Message]
    messages_len: int
    pending: list[int]
    tools: list[Message] | None
    drifts_len: int


@dataclass
class Conversation:
    chat: ChatFormat
    ids: list[int] = field(default_factory=list)
    pieces: list[list[int]] = field(default_factory=list)  # prompt, output, observation, output, ...
    messages: list[Message] = field(default_factory=list)
    pending_observation: list[int] = field(default_factory=list)  # appended, not yet on an event
    tools: list[Message] | None = None  # OpenAI tools the context was rendered with (gateway sessions)
    drifts: list[HistoryDrift] = field(default_factory=list)
    _texts: list[tuple[list[int], str]] = field(default_factory=list)  # (piece, its JSON text) cache

    @classmethod
    def start(cls, chat: ChatFormat, system: str, instance: str) -> Conversation:
        prompt = chat.prompt(system, instance)
        messages: list[Message] = [
            {"role": "system", "content": system},
            {"role": "user", "content": instance},
        ]
        return cls(chat, list(prompt), [list(prompt)], messages)

    @classmethod
    def from_messages(
        cls, chat: ChatFormat, messages: list[Message], tools: list[Message] | None
    ) -> Conversation:
        """A client's first messages (OpenAI form) rendered once; the prompt is also pending."""
        prompt = chat.render_ids(messages, tools)
        return cls(chat, list(prompt), [list(prompt)], list(messages), list(prompt), tools)

    @property
    def prompt(self) -> list[int]:
        return self.pieces[0]

    @property
    def turns(self) -> int:
        return sum(1 for message in self.messages if message["role"] == "assistant")

    def __len__(self) -> int:
        return len(self.ids)

    def add_output(self, output_ids: Sequence[int], message: Message | None = None) -> None:
        """The engine's output of one turn, exactly as produced (`message`: the assistant message it
        was read as, e.g. with tool calls; by default its text)."""
        self.ids.extend(output_ids)
        self.pieces.append(list(output_ids))
        self.messages.append(message or {"role": "assistant", "content": self.chat.reply_text(output_ids)})

    def add_messages(self, messages: list[Message]) -> list[int]:
        """Append `messages` (OpenAI form) after the last output; returns the ids (also pending)."""
        ids = self.chat.continuation(self.pieces[-1], messages)
        self.ids.extend(ids)
        self.pieces.append(ids)
        self.messages.extend(messages)
        self.pending_observation = ids
        return ids

    def rebase(
        self, messages: list[Message], tools: list[Message] | None, turn: int, message: int, reason: str
    ) -> HistoryDrift:
        """Re-render the context from `messages` (a client changed its history at index `message`):
        the old context's longest common prefix with the new one is kept, the rest is pending."""
        ids = self.chat.render_ids(messages, tools)
        kept = _common_prefix(self.ids, ids)
        drift = HistoryDrift(
            turn=turn, message=message, offset=kept, replaced_tokens=len(self.ids) - kept, reason=reason
        )
        self.ids, self.pieces, self.messages, self.tools = list(ids), [list(ids)], list(messages), tools
        self.pending_observation = ids[kept:]
        self.drifts.append(drift)
        return drift

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

    def encoded_ids(self) -> EncodedIds:
        """The context's ids with their JSON text, each piece encoded once (pieces are never changed
        in place: a piece that is not the cached one is encoded again)."""
        texts = self._texts
        del texts[len(self.pieces) :]
        for index, piece in enumerate(self.pieces):
            if index == len(texts):
                texts.append((piece, ",".join(map(str, piece))))
            elif texts[index][0] is not piece:
                texts[index] = (piece, ",".join(map(str, piece)))
        return EncodedIds(self.ids, "[" + ",".join(text for _, text in texts if text) + "]")

    def checkpoint(self) -> Checkpoint:
        """Where the conversation is now, to `restore` if what follows is not kept (a failed call)."""
        return Checkpoint(
            self.ids,
            len(self.ids),
            self.pieces,
            len(self.pieces),
            self.messages,
            len(self.messages),
            self.pending_observation,
            self.tools,
            len(self.drifts),
        )

    def restore(self, point: Checkpoint) -> None:
        """Back to `point`: appends are cut off, a rebase's new lists dropped (the old ones were kept)."""
        self.ids, self.pieces, self.messages = point.ids, point.pieces, point.messages
        del self.ids[point.ids_len :]
        del self.pieces[point.pieces_len :]
        del self.messages[point.messages_len :]
        self.pending_observation, self.tools = point.pending, point.tools
        del self.drifts[point.drifts_len :]

    def drift(self) -> RenderDrift | None:
        """Where a re-render of the messages differs from the ids the engine saw (None: nowhere)."""
        if self.turns == 0:
            return None
        try:
            return self.chat.render_drift(self.pieces, self.messages, self.tools)
        except ChatTemplateError as error:  # the template refuses its own history: say so
            return RenderDrift(turn=self.turns, offset=0, seen="", rendered=f"re-render failed: {error}")


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)
