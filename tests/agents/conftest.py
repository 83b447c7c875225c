"""Fixtures of the agents tests: a locally trained tokenizer and its chat format."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from agents.chat import ChatFormat
from trainer.tokenizer import train_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return train_tokenizer(1024)


@pytest.fixture(scope="session")
def chat(tokenizer: Tokenizer) -> ChatFormat:
    return ChatFormat.for_tokenizer(tokenizer)
