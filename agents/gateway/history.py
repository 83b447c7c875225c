"""Whether a request's history extends what the engine saw in its session (pure).

The gateway keeps, per session, the messages of its last request followed by the assistant
message it answered with (normalised, `agents.gateway.requests`). The next request extends
them when it starts with exactly those messages and adds at least one: then only the added
messages are rendered and tokenised, after the ids the engine already saw. Anything else (a
message edited or dropped, one inserted before the end, the answer changed or missing, other
tools) is a rewrite: the context is rendered again from the messages, and the reason and the
first message that differs are recorded (`HistoryDrift`).

`Seen.plan` first compares the request's messages as sent with the previous request's (one
list comparison in C), and normalises only the messages after them; the slow path, which
normalises them all, runs only when that comparison fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from agents.gateway.requests import Message, normalise_messages


@dataclass(frozen=True)
class Extend:
    added: list[Message]


@dataclass(frozen=True)
class Rewrite:
    message: int  # index of the first message that differs
    reason: str  # edited | dropped | inserted | tools


def plan(
    seen: list[Message],
    seen_tools: list[Message] | None,
    messages: list[Message],
    tools: list[Message] | None,
) -> Extend | Rewrite:
    """How to build this request's context from the session's (see the module docstring)."""
    if tools != seen_tools:
        return Rewrite(0, "tools")
    index = next((i for i, (a, b) in enumerate(zip(seen, messages, strict=False)) if a != b), None)
    if index is None and len(messages) > len(seen):
        return Extend(messages[len(seen) :])
    if index is None:  # a prefix of what was seen (e.g. a retry without the answer it missed)
        return Rewrite(len(messages), "dropped")
    return Rewrite(index, _reason(seen, messages, index))


def _reason(seen: list[Message], messages: list[Message], index: int) -> str:
    if seen[index + 1 :] == messages[index : len(seen) - 1]:
        return "dropped"
    if seen[index:] == messages[index + 1 : len(seen) + 1]:
        return "inserted"
    return "edited"


@dataclass
class Seen:
    """What a session's engine has seen: the last request's messages (as sent and normalised), its
    tools and the answer (normalised)."""

    raw: list[object]
    messages: list[Message]  # normalised: the last request's, then the answer
    tools: list[Message] | None

    @classmethod
    def nothing(cls) -> Seen:
        return cls([], [], None)

    def plan(
        self, raw: list[object], tools: list[Message] | None
    ) -> tuple[Extend | Rewrite, list[Message] | None]:
        """The plan for a request, and its whole normalised history when it had to be computed
        (a rewrite, or a slow-path extension); None when only the added messages were."""
        known = len(self.raw)
        if known and len(raw) > known and tools == self.tools and raw[:known] == self.raw:
            tail = normalise_messages(raw[known:], known)
            answer = self.messages[known:]
            if tail[: len(answer)] == answer and len(tail) > len(answer):
                return Extend(tail[len(answer) :]), None
        messages = normalise_messages(raw)
        return plan(self.messages, self.tools, messages, tools), messages

    def update(
        self,
        raw: list[object],
        tools: list[Message] | None,
        added: list[Message] | None,
        whole: list[Message] | None,
        answer: Message,
    ) -> None:
        """After an answered call: the request's messages (`whole`, or the ones seen plus `added`), then
        the answer."""
        if whole is not None:
            self.messages = [*whole, answer]
        else:
            self.messages.extend(added or [])
            self.messages.append(answer)
        self.raw, self.tools = raw, tools
