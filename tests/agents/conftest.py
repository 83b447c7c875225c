"""Fixtures of the agents tests: a locally trained tokenizer and its chat format, and an
event sink that collects what an episode emits."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from agents.chat import ChatFormat
from streams.events import Event
from trainer.tokenizer import train_tokenizer


class Collected:
    """An episode's event sink that keeps every event in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    def types(self) -> list[str]:
        return [e.type for e in self.events]


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return train_tokenizer(1024)


@pytest.fixture(scope="session")
def chat(tokenizer: Tokenizer) -> ChatFormat:
    return ChatFormat.for_tokenizer(tokenizer)
