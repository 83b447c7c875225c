"""The locally trained byte-level BPE tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.tokenizer import (
    ENDOFTEXT,
    IM_END,
    IM_START,
    load_tokenizer,
    save_tokenizer,
    special_token_ids,
    train_tokenizer,
)

TOKENIZER = train_tokenizer(1024)


def test_special_tokens_have_fixed_ids_and_encode_as_one_token() -> None:
    assert special_token_ids(TOKENIZER) == {ENDOFTEXT: 0, IM_START: 1, IM_END: 2}
    ids = TOKENIZER.encode(f"{IM_START}user\nhi{IM_END}").ids
    assert ids[0] == 1 and ids[-1] == 2
    assert TOKENIZER.decode(ids, skip_special_tokens=False) == f"{IM_START}user\nhi{IM_END}"


def test_training_is_deterministic() -> None:
    assert train_tokenizer(1024).to_str() == TOKENIZER.to_str()
    assert TOKENIZER.get_vocab_size() == 1024


def test_bpe_compresses_code() -> None:
    text = "def main(argv):\n    return subprocess.run(['git', 'diff'], check=True)\n"
    assert len(TOKENIZER.encode(text).ids) < len(text.encode()) / 2


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_any_text_round_trips(text: str) -> None:
    assert TOKENIZER.decode(TOKENIZER.encode(text).ids, skip_special_tokens=False) == text


def test_save_and_load(tmp_path: Path) -> None:
    save_tokenizer(TOKENIZER, tmp_path)
    assert load_tokenizer(tmp_path).to_str() == TOKENIZER.to_str()
    with pytest.raises(FileNotFoundError, match="rollstream model init"):
        load_tokenizer(tmp_path / "missing")


def test_too_small_vocab_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        train_tokenizer(100)
