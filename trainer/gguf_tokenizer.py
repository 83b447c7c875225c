"""The tokenizer of a GGUF file as Hugging Face files, built from the file's own metadata.

`read_gguf_tokenizer(path)` reads the vocabulary, merges, token types, special token
ids, pre-tokenizer name and chat template of a GGUF file and builds the `tokenizers`
tokenizer llama.cpp runs on it; `write_tokenizer_files(tokenizer, out_dir, max_length)`
writes `tokenizer.json`, `tokenizer_config.json` (class `PreTrainedTokenizerFast`, which
transformers 4 and 5 both load tokenizer.json with as it is; special tokens; the chat
template) and `chat_template.jinja`.

Why not transformers' own GGUF tokenizer conversion: it ignores `tokenizer.ggml.pre` and
changes between versions. For SmolLM2 (pre `smollm`: every digit its own piece, then the
GPT-2 split), 5.17 splits "\\n    10" as [Ċ, ĠĠĠ, Ġ, 1, 0] where the model's tokenizer gives
[ĊĠĠĠĠ, 1, 0]; 5.3 and 4.57 add a bos to every encoding though the GGUF says
`add_bos_token` false, and 5.3 adds five CodeLlama tokens beyond the vocabulary; 5.17
names `<|im_start|>` (id 1) as eos where the GGUF says 2.

Supported: `tokenizer.ggml.model` "gpt2" (byte-level BPE) with a pre-tokenizer of
`PRE_TOKENIZERS`; anything else is a `GgufTokenizerError` naming the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf import GGUFReader, TokenType
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
KEY = "tokenizer.ggml."
# tokenizer_config.json name -> GGUF metadata key of its id
SPECIAL_TOKEN_KEYS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "pad_token": "padding_token_id",
    "unk_token": "unknown_token_id",
}


def _gpt2_split() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2_split() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2_split()])


# `tokenizer.ggml.pre` -> the split llama.cpp applies before BPE (llama-vocab.cpp's regex_exprs)
PRE_TOKENIZERS = {
    "gpt2": _gpt2_split,
    "smollm": _digits_then_gpt2_split,
    "starcoder": _digits_then_gpt2_split,
}


class GgufTokenizerError(ValueError):
    """The GGUF tokenizer metadata is missing a field or uses one not supported here."""


@dataclass(frozen=True)
class GgufTokenizer:
    tokenizer: Tokenizer
    special_ids: dict[str, int]  # bos_token, eos_token, pad_token, unk_token -> id (those the GGUF names)
    add_bos_token: bool
    add_eos_token: bool
    chat_template: str

    def token(self, name: str) -> str | None:
        token_id = self.special_ids.get(name)
        return None if token_id is None else self.tokenizer.id_to_token(token_id)


def read_gguf_tokenizer(path: Path) -> GgufTokenizer:
    fields = _Fields(GGUFReader(path), path)
    if fields.get("model") != "gpt2":
        raise GgufTokenizerError(
            f"{path.name}: {KEY}model is {fields.get('model')!r}; only 'gpt2' is supported"
        )
    pre = fields.get("pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise GgufTokenizerError(f"{path.name}: {KEY}pre {pre!r} unknown; known: {', '.join(PRE_TOKENIZERS)}")
    tokens: list[str] = fields.need("tokens")
    types: list[int] = fields.need("token_type")
    if len(types) != len(tokens):
        raise GgufTokenizerError(f"{path.name}: {len(tokens)} tokens but {len(types)} {KEY}token_type")
    pairs = [tuple(merge.split(" ")) for merge in fields.need("merges")]
    if any(len(pair) != 2 for pair in pairs):
        raise GgufTokenizerError(f"{path.name}: {KEY}merges has an entry that is not two tokens")
    tokenizer = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, pairs))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == TokenType.CONTROL
        ]
    )
    tokenizer.add_tokens(
        [
            AddedToken(t, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == TokenType.USER_DEFINED
        ]
    )
    special_ids = {name: fields.get(key) for name, key in SPECIAL_TOKEN_KEYS.items()}
    special_ids = {name: int(i) for name, i in special_ids.items() if i is not None}
    if any(i >= len(tokens) for i in special_ids.values()):
        raise GgufTokenizerError(f"{path.name}: a special token id is beyond the vocabulary: {special_ids}")
    add_bos, add_eos = bool(fields.get("add_bos_token", False)), bool(fields.get("add_eos_token", False))
    tokenizer.post_processor = _post_processor(tokenizer, special_ids, add_bos, add_eos)
    template = fields.get("chat_template", key_prefix="tokenizer.")
    if not template:
        raise GgufTokenizerError(f"{path.name}: no tokenizer.chat_template; a chat model needs one")
    return GgufTokenizer(tokenizer, special_ids, add_bos, add_eos, template)


def write_tokenizer_files(gguf: GgufTokenizer, out_dir: Path, model_max_length: int) -> None:
    gguf.tokenizer.save(str(out_dir / TOKENIZER_FILE))
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **{name: gguf.token(name) for name in SPECIAL_TOKEN_KEYS if name in gguf.special_ids},
        "add_bos_token": gguf.add_bos_token,
        "add_eos_token": gguf.add_eos_token,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,  # it corrupts byte-level BPE text on decode
        "model_max_length": model_max_length,
        "chat_template": gguf.chat_template,  # where readers before transformers 5 look
    }
    (out_dir / TOKENIZER_CONFIG).write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (out_dir / TEMPLATE_FILE).write_text(gguf.chat_template)


def _post_processor(
    tokenizer: Tokenizer, special_ids: dict[str, int], add_bos: bool, add_eos: bool
) -> processors.PostProcessor:
    if not (add_bos or add_eos):
        return processors.ByteLevel(trim_offsets=False)
    bos = [special_ids["bos_token"]] if add_bos else []
    eos = [special_ids["eos_token"]] if add_eos else []
    names = {i: tokenizer.id_to_token(i) for i in bos + eos}
    single = " ".join([*(names[i] for i in bos), "$A", *(names[i] for i in eos)])
    pair = " ".join([single, *(names[i] for i in bos), "$B:1", *(names[i] for i in eos)])
    return processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(name, i) for i, name in names.items()]
    )


class _Fields:
    """GGUF metadata values by key (under `tokenizer.ggml.` unless told otherwise)."""

    def __init__(self, reader: GGUFReader, path: Path) -> None:
        self.reader, self.path = reader, path

    def get(self, name: str, default: Any = None, *, key_prefix: str = KEY) -> Any:
        field = self.reader.fields.get(key_prefix + name)
        return default if field is None else field.contents()

    def need(self, name: str) -> Any:
        value = self.get(name)
        if value is None:
            raise GgufTokenizerError(f"{self.path.name}: no {KEY}{name}")
        return value
