"""The tokenizer built from a GGUF file's metadata, on small GGUF files written here with the
`gguf` package: the pre-tokenizer the metadata names (digits apart for `smollm`), bos added
only when `add_bos_token` says so, control tokens special, and a clear error for what is
not supported. The real SmolLM2 tokenizer is tested in test_smollm2.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gguf import GGUFWriter, TokenType

from trainer.gguf_tokenizer import (
    GgufTokenizerError,
    read_gguf_tokenizer,
    write_tokenizer_files,
)

TEMPLATE = "{% for m in messages %}<s>{{ m['content'] }}</s>{% endfor %}"
# byte-level symbols: "Ġ" is the space; "ĠĠ" is a merged pair of spaces
TOKENS = ["<unk>", "<s>", "</s>", "a", "b", "Ġ", "1", "0", "ab", "Ġa", "ĠĠ", "Ċ", "ĊĠ", "<tool>"]
MERGES = ["a b", "Ġ a", "Ġ Ġ", "Ċ Ġ"]
TYPES = [TokenType.CONTROL, TokenType.CONTROL, TokenType.CONTROL]
TYPES += [TokenType.NORMAL] * (len(TOKENS) - 4) + [TokenType.USER_DEFINED]


def write_gguf(path: Path, *, pre: str = "smollm", add_bos: bool = False, model: str = "gpt2") -> Path:
    writer = GGUFWriter(path, arch="llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(TOKENS)
    writer.add_token_types([int(t) for t in TYPES])
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(add_bos)
    writer.add_chat_template(TEMPLATE)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def ids(*tokens: str) -> list[int]:
    return [TOKENS.index(t) for t in tokens]


def test_smollm_splits_every_digit_before_the_gpt2_split(tmp_path: Path) -> None:
    tokenizer = read_gguf_tokenizer(write_gguf(tmp_path / "t.gguf")).tokenizer
    # the two spaces before a digit stay one piece, merged; with the GPT-2 split alone
    # " 10" would be a piece of its own and the spaces would not merge
    assert tokenizer.encode("ab  10").ids == ids("ab", "ĠĠ", "1", "0")
    assert tokenizer.encode("a\n 1").ids == ids("a", "ĊĠ", "1")
    assert tokenizer.decode(tokenizer.encode("ab  10 a").ids) == "ab  10 a"
    gpt2 = read_gguf_tokenizer(write_gguf(tmp_path / "g.gguf", pre="gpt2")).tokenizer
    assert gpt2.encode("ab  10").ids == ids("ab", "Ġ", "Ġ", "1", "0")


def test_bos_is_added_only_when_the_metadata_says_so(tmp_path: Path) -> None:
    plain = read_gguf_tokenizer(write_gguf(tmp_path / "plain.gguf", add_bos=False))
    assert plain.tokenizer.encode("ab").ids == ids("ab")
    with_bos = read_gguf_tokenizer(write_gguf(tmp_path / "bos.gguf", add_bos=True))
    assert with_bos.tokenizer.encode("ab").ids == ids("<s>", "ab")
    assert with_bos.tokenizer.encode("ab", add_special_tokens=False).ids == ids("ab")


def test_control_tokens_are_special_and_the_files_name_them(tmp_path: Path) -> None:
    gguf = read_gguf_tokenizer(write_gguf(tmp_path / "t.gguf"))
    encoded = gguf.tokenizer.encode("<s>ab</s><tool>")
    assert encoded.ids == ids("<s>", "ab", "</s>", "<tool>")
    assert gguf.tokenizer.decode(encoded.ids) == "ab<tool>"  # control tokens skipped, user ones kept
    write_tokenizer_files(gguf, tmp_path, model_max_length=512)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == ("<s>", "</s>", "<unk>")
    assert "pad_token" not in config  # the GGUF names none
    assert config["chat_template"] == (tmp_path / "chat_template.jinja").read_text() == TEMPLATE
    assert config["model_max_length"] == 512 and config["add_bos_token"] is False


def test_what_is_not_supported_is_refused_naming_the_field(tmp_path: Path) -> None:
    with pytest.raises(GgufTokenizerError, match=r"tokenizer\.ggml\.pre 'qwen2' unknown; known: gpt2"):
        read_gguf_tokenizer(write_gguf(tmp_path / "q.gguf", pre="qwen2"))
    with pytest.raises(GgufTokenizerError, match=r"tokenizer\.ggml\.model is 'llama'"):
        read_gguf_tokenizer(write_gguf(tmp_path / "l.gguf", model="llama"))
