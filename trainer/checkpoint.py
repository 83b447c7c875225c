"""Model directories in Hugging Face layout.

A model directory holds `config.json` (LlamaForCausalLM fields), `model.safetensors`
(fp32, HF parameter names), `tokenizer.json`, `tokenizer_config.json` and
`generation_config.json`, so the same directory loads in `transformers`, SGLang and
here. Our own additions live under the `rollstream` key of `config.json` (the weight
version); HF readers ignore it.

`init_model_dir(settings, path)` creates one with random weights; `save_version(model,
base_dir, out_dir, version)` writes a complete directory for a new weight version;
`save_model(model, path, weight_version)` (or `save_weights(tensors, config, ...)`, for
a backend's HF-named tensors) writes new weights into a directory
(atomically: a temp file then rename, so an engine reloading the directory never sees
half a file); `load_model(path)` reads it.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from trainer.model import ModelConfig, PolicyModel, build_model
from trainer.settings import ModelSettings
from trainer.tokenizer import (
    ENDOFTEXT,
    IM_END,
    save_tokenizer,
    special_token_ids,
    train_tokenizer,
)

CONFIG_FILE = "config.json"
# ChatML, as Qwen models use: what `transformers` and SGLang apply for chat requests.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
WEIGHTS_FILE = "model.safetensors"


def hf_config(config: ModelConfig, specials: dict[str, int], weight_version: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_position,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": specials[ENDOFTEXT],
        "eos_token_id": specials[IM_END],
        "pad_token_id": specials[ENDOFTEXT],
        "torch_dtype": "float32",
        "use_cache": True,
        "rollstream": {"weight_version": weight_version},
    }


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    temp = path.with_suffix(path.suffix + ".tmp")
    temp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(temp, path)


def _write_side_files(path: Path, config: ModelConfig, specials: dict[str, int]) -> None:
    _write_json(
        path / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": IM_END,
            "pad_token": ENDOFTEXT,
            "unk_token": None,
            "model_max_length": config.max_position,
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    _write_json(
        path / "generation_config.json",
        {"eos_token_id": [specials[IM_END], specials[ENDOFTEXT]], "pad_token_id": specials[ENDOFTEXT]},
    )


def init_model_dir(settings: ModelSettings, path: Path) -> Path:
    """A new model directory with random weights (seeded by `settings.seed`), weight version 0."""
    path = Path(path)
    if (path / WEIGHTS_FILE).exists():
        raise FileExistsError(f"{path} already holds a model; pick another directory or delete it")
    path.mkdir(parents=True, exist_ok=True)
    config = ModelConfig.from_settings(settings)
    tokenizer = train_tokenizer(settings.vocab_size)
    if tokenizer.get_vocab_size() != settings.vocab_size:
        raise ValueError(
            f"the built-in corpus only supports {tokenizer.get_vocab_size()} BPE tokens; "
            f"set model.vocab_size to at most that"
        )
    save_tokenizer(tokenizer, path)
    specials = special_token_ids(tokenizer)
    _write_side_files(path, config, specials)
    save_model(build_model(config, settings.seed), path, weight_version=0, specials=specials)
    return path


def save_model(
    model: PolicyModel, path: Path, weight_version: int, specials: dict[str, int] | None = None
) -> None:
    """Write weights and config.json (weights first, config last: the config names the version)."""
    save_weights(model.state_dict(), model.config, path, weight_version, specials)


def save_weights(
    tensors: Mapping[str, torch.Tensor],
    config: ModelConfig,
    path: Path,
    weight_version: int,
    specials: dict[str, int] | None = None,
) -> None:
    """`save_model` for tensors under HF names (a backend's `hf_state_dict`), with no model built."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if specials is None:
        specials = read_config(path).specials
    temp = path / (WEIGHTS_FILE + ".tmp")
    contiguous = {name: t.detach().contiguous().float().cpu() for name, t in tensors.items()}
    save_file(contiguous, str(temp), metadata={"format": "pt"})
    os.replace(temp, path / WEIGHTS_FILE)
    _write_json(path / CONFIG_FILE, hf_config(config, specials, weight_version))


@dataclass(frozen=True)
class ModelDirInfo:
    """What config.json says: the architecture, the weight version, the special token ids."""

    model: ModelConfig
    weight_version: int
    specials: dict[str, int]


SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def save_version(model: PolicyModel, base_dir: Path, out_dir: Path, weight_version: int) -> Path:
    """A complete model directory for a new weight version (what `/update_weights_from_disk` loads):
    the tokenizer and side files of `base_dir`, the weights of `model`."""
    return save_version_weights(model.state_dict(), model.config, base_dir, out_dir, weight_version)


def save_version_weights(
    tensors: Mapping[str, torch.Tensor],
    config: ModelConfig,
    base_dir: Path,
    out_dir: Path,
    weight_version: int,
) -> Path:
    """`save_version` for tensors under HF names."""
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    specials = read_config(base_dir).specials
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in SIDE_FILES:
        shutil.copyfile(base_dir / name, out_dir / name)
    save_weights(tensors, config, out_dir, weight_version, specials)
    return out_dir


def read_config(path: Path) -> ModelDirInfo:
    """The config of a model directory, or a clear error when it is not one."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: create the model first with `rollstream model init`")
    raw = json.loads(file.read_text())
    config = ModelConfig(
        vocab_size=raw["vocab_size"],
        hidden_size=raw["hidden_size"],
        num_layers=raw["num_hidden_layers"],
        num_heads=raw["num_attention_heads"],
        num_kv_heads=raw["num_key_value_heads"],
        intermediate_size=raw["intermediate_size"],
        max_position=raw["max_position_embeddings"],
        rope_theta=raw["rope_theta"],
        rms_norm_eps=raw["rms_norm_eps"],
    )
    specials = {ENDOFTEXT: raw["pad_token_id"], IM_END: raw["eos_token_id"]}
    version = int(raw.get("rollstream", {}).get("weight_version", 0))
    return ModelDirInfo(model=config, weight_version=version, specials=specials)


def load_model(path: Path) -> PolicyModel:
    """The model of a directory, fp32, in eval mode."""
    config = read_config(path).model
    model = PolicyModel(config)
    weights = Path(path) / WEIGHTS_FILE
    if not weights.is_file():
        raise FileNotFoundError(f"{weights} not found")
    state = load_file(str(weights))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{weights} does not match config.json: missing {missing}, unexpected {unexpected}")
    return model.eval()


def weight_version(path: Path) -> int:
    return read_config(path).weight_version
