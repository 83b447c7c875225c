"""Model directories in Hugging Face layout: read any supported checkpoint; versions keep its layout.

A model directory is what `transformers` and SGLang load: `config.json`, the weights
(`model.safetensors`, or shards named by `model.safetensors.index.json`), `tokenizer.json`,
`tokenizer_config.json` (with its `chat_template`, or a `chat_template.jinja` beside it) and
`generation_config.json`. Our own addition lives under the `rollstream` key of `config.json`
(the weight version); HF readers ignore it.

- `read_config(path)` parses `config.json` (`trainer.hf_config`: Llama, Qwen2, Qwen3; anything
  else is refused naming the field); `check_model_dir(path)` checks everything a run needs
  (config, every shard, tokenizer, chat template) before any process starts.
- `load_model(path, dtype)` builds the `PolicyModel` and loads its weights, in fp32 unless told.
- `save_version_weights(weights, config, base_dir, out_dir, version)` writes a complete directory
  for a new weight version with the base's layout: its config.json (architecture, tying, dtype)
  with the new version, every side file copied, the weights in the base's dtype, a tied output
  layer left out as `save_pretrained` does. One `model.safetensors` whatever the base's sharding;
  its bytes (`version_weights`) are made apart from the writing, the torch work of a save.
- `init_model_dir(settings, path)` creates our own small random model (tokenizer trained here).

Writes are atomic (temp file, then rename), so an engine reloading a directory never sees half
a file.
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
from safetensors import safe_open

from trainer.hf_config import UnsupportedModelError, model_config_from_hf, stored_dtype
from trainer.model import ModelConfig, PolicyModel, build_model
from trainer.settings import ModelSettings
from trainer.tokenizer import ENDOFTEXT, IM_END, save_tokenizer, special_token_ids, train_tokenizer
from trainer.weights_stage import WeightsStage, file_size, lay_out, write_direct

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"
GENERATION_CONFIG = "generation_config.json"
# ChatML, as Qwen models use: what `transformers` and SGLang apply for chat requests.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS_METADATA = {"format": "pt"}  # what transformers checks for in a safetensors header
# Keys some checkpoints carry that are not parameters (recomputed from the config).
IGNORED_KEYS = ("rotary_emb.inv_freq",)


class ModelDirError(ValueError):
    """A directory that is not a usable model; the message names the file, the field and what to do."""


@dataclass(frozen=True)
class ModelDirInfo:
    """What config.json says: the architecture, the weight version, the stored dtype, and the raw dict."""

    model: ModelConfig
    weight_version: int
    dtype: str
    raw: dict[str, Any]


def read_config(path: Path) -> ModelDirInfo:
    """The config of a model directory, or a clear error when it is not one we can run."""
    file = Path(path) / CONFIG_FILE
    if not file.is_file():
        raise ModelDirError(
            f"{file} not found: point --model at a Hugging Face model directory "
            "(`rollstream model get NAME`, or `rollstream model init` for a small random one)"
        )
    raw = json.loads(file.read_text())
    try:
        config = model_config_from_hf(raw, str(file))
        dtype = stored_dtype(raw, str(file))
    except UnsupportedModelError as error:
        raise ModelDirError(str(error)) from error
    version = int((raw.get("rollstream") or {}).get("weight_version", 0))
    return ModelDirInfo(model=config, weight_version=version, dtype=dtype, raw=raw)


def weight_version(path: Path) -> int:
    return read_config(path).weight_version


def weight_files(path: Path) -> list[Path]:
    """The safetensors files holding the weights: the one file, or every shard the index names."""
    path = Path(path)
    index = path / WEIGHTS_INDEX
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [name for name in shards if not (path / name).is_file()]
        if missing:
            raise ModelDirError(f"{index} names shards that are missing: {missing}; copy them into {path}")
        return [path / name for name in shards]
    if (path / WEIGHTS_FILE).is_file():
        return [path / WEIGHTS_FILE]
    raise ModelDirError(f"{path} has no {WEIGHTS_FILE} and no {WEIGHTS_INDEX}: the weights are missing")


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in weight_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 (safe_open is not a mapping)
                if not name.endswith(IGNORED_KEYS):
                    tensors[name] = handle.get_tensor(name)
    return tensors


def load_model(path: Path, dtype: torch.dtype = torch.float32) -> PolicyModel:
    """The model of a directory in `dtype`, in eval mode."""
    info = read_config(path)
    model = PolicyModel(info.model)
    state = read_weights(path)
    if info.model.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # some tied checkpoints store it anyway: the embedding rules
    expected = set(model.state_dict())
    if info.model.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ModelDirError(
            f"the weights in {path} do not match its config.json ({info.model.architecture}): "
            f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, "
            f"unexpected {unexpected[:5]}{'…' if len(unexpected) > 5 else ''}"
        )
    model.load_state_dict(state, strict=False)
    return model.to(dtype).eval()


def weights_file(tensors: Mapping[str, torch.Tensor], config: ModelConfig, dtype: str = "float32") -> bytes:
    """The `model.safetensors` of HF-named tensors in `dtype` (a tied output layer left out), in
    memory: this is the torch work of a save, so a trainer makes it on its compute thread
    (`trainer.compute_thread`) and a writer thread only writes the bytes."""
    kept = file_tensors(tensors, config)
    buffer = bytearray(file_size(kept, TORCH_DTYPES[dtype], WEIGHTS_METADATA))
    lay_out(memoryview(buffer), kept, TORCH_DTYPES[dtype], WEIGHTS_METADATA)
    return bytes(buffer)


def file_tensors(tensors: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """What a `model.safetensors` holds: every tensor but a tied output layer."""
    return {n: t for n, t in tensors.items() if not (config.tie_word_embeddings and n == "lm_head.weight")}


def save_weights(
    tensors: Mapping[str, torch.Tensor], config: ModelConfig, path: Path, dtype: str = "float32"
) -> None:
    """Write HF-named tensors as `model.safetensors` in `dtype` (a tied output layer left out)."""
    write_weights_file(weights_file(tensors, config, dtype), path)


def write_weights_file(data: bytes | memoryview, path: Path) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    temp = path / (WEIGHTS_FILE + ".tmp")
    write_direct(temp, data)
    os.replace(temp, path / WEIGHTS_FILE)


def save_model(model: PolicyModel, path: Path, weight_version: int) -> None:
    """New weights into an existing model directory, keeping its config (weights first, then the
    config naming the version)."""
    info = read_config(path)
    save_weights(model.state_dict(), model.config, path, info.dtype)
    _write_config(path, info.raw, weight_version)


def save_version(model: PolicyModel, base_dir: Path, out_dir: Path, weight_version: int) -> Path:
    """A complete model directory for a new weight version (what `/update_weights_from_disk` loads)."""
    weights = version_weights(model.state_dict(), model.config, base_dir)
    return save_version_weights(weights, model.config, base_dir, out_dir, weight_version)


def save_version_weights(
    weights: bytes | memoryview,
    config: ModelConfig,
    base_dir: Path,
    out_dir: Path,
    weight_version: int,
) -> Path:
    """`save_version` for a `weights_file` made in the base's dtype (`version_weights`): the base's
    side files and config, these weights. No torch work: a writer thread runs it."""
    base_dir, out_dir = Path(base_dir), Path(out_dir)
    info = read_config(base_dir)
    if config != info.model:
        raise ModelDirError(f"the weights to publish have another architecture than {base_dir}")
    out_dir.mkdir(parents=True, exist_ok=True)
    for item in sorted(base_dir.iterdir()):
        if item.is_file() and not _is_weights_or_config(item.name):
            shutil.copyfile(item, out_dir / item.name)
    write_weights_file(weights, out_dir)
    _write_config(out_dir, info.raw, weight_version)
    return out_dir


def version_weights(tensors: Mapping[str, torch.Tensor], config: ModelConfig, base_dir: Path) -> bytes:
    """The `weights_file` of a new version of `base_dir`: in the base's dtype."""
    return weights_file(tensors, config, read_config(base_dir).dtype)


def stage_version_weights(
    stage: WeightsStage, tensors: Mapping[str, torch.Tensor], config: ModelConfig, base_dir: Path
) -> memoryview:
    """`version_weights` laid out in `stage`'s buffer (the same bytes): valid until its next use."""
    dtype = TORCH_DTYPES[read_config(base_dir).dtype]
    return stage.stage(file_tensors(tensors, config), dtype, WEIGHTS_METADATA)


def _is_weights_or_config(name: str) -> bool:
    return name in (CONFIG_FILE, WEIGHTS_INDEX) or name.endswith((".safetensors", ".bin", ".tmp"))


def _write_config(path: Path, raw: dict[str, Any], weight_version: int) -> None:
    config = {**raw, "rollstream": {**(raw.get("rollstream") or {}), "weight_version": weight_version}}
    _write_json(Path(path) / CONFIG_FILE, config)


def _write_json(path: Path, payload: dict[str, Any]) -> None:
    temp = path.with_suffix(path.suffix + ".tmp")
    temp.write_text(json.dumps(payload, indent=2) + "\n")
    os.replace(temp, path)


# ---- our own small model ---------------------------------------------------------------------


def own_hf_config(config: ModelConfig, specials: dict[str, int]) -> dict[str, Any]:
    """config.json of a model made by `init_model_dir` (LlamaForCausalLM, fp32)."""
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
    }


def _write_own_side_files(path: Path, config: ModelConfig, specials: dict[str, int]) -> None:
    _write_json(
        path / TOKENIZER_CONFIG,
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
        path / GENERATION_CONFIG,
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
    _write_own_side_files(path, config, specials)
    save_weights(build_model(config, settings.seed).state_dict(), config, path)
    _write_config(path, own_hf_config(config, specials), 0)
    return path


# ---- what else a run needs from the directory ------------------------------------------------


def tokenizer_config(path: Path) -> dict[str, Any]:
    file = Path(path) / TOKENIZER_CONFIG
    return json.loads(file.read_text()) if file.is_file() else {}


def chat_template_text(path: Path) -> str:
    """The model's chat template: `chat_template` of tokenizer_config.json (a string, or a list of
    named templates of which the `default` one), else `chat_template.jinja` (transformers 5)."""
    path = Path(path)
    template = tokenizer_config(path).get("chat_template")
    if isinstance(template, list):
        named = {item.get("name"): item.get("template") for item in template if isinstance(item, dict)}
        template = named.get("default")
    if isinstance(template, str) and template.strip():
        return template
    if (path / TEMPLATE_FILE).is_file():
        return (path / TEMPLATE_FILE).read_text()
    raise ModelDirError(
        f"{path / TOKENIZER_CONFIG} has no `chat_template` and there is no {TEMPLATE_FILE}: episodes render "
        "prompts with the model's own template; add the template the model was trained with"
    )


def generation_eos_ids(path: Path) -> tuple[int, ...]:
    """The end-of-sequence ids of generation_config.json (an int or a list), else config.json's."""
    path = Path(path)
    file = path / GENERATION_CONFIG
    value = json.loads(file.read_text()).get("eos_token_id") if file.is_file() else None
    if value is None:
        value = read_config(path).raw.get("eos_token_id")
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


def check_runnable_dtype(dtype: str, device: str = "cpu") -> torch.dtype:
    """The torch dtype for a setting's name, after a tiny matmul proved the device runs it."""
    if dtype not in TORCH_DTYPES:
        raise ModelDirError(f"dtype {dtype!r} is not one of {', '.join(TORCH_DTYPES)}")
    target = TORCH_DTYPES[dtype]
    try:
        probe = torch.ones((4, 4), dtype=target, device=device)
        (probe @ probe).sum().item()
    except (RuntimeError, TypeError) as error:
        raise ModelDirError(
            f"dtype {dtype} cannot run on device {device} ({error}); set the dtype to float32"
        ) from error
    return target


def check_model_dir(path: Path, dtype: str | None = None, device: str = "cpu") -> ModelDirInfo:
    """Everything a run needs from a model directory, checked before any process starts: the config
    (a supported family), every weight file, the tokenizer and the chat template, and that `dtype`
    (default: the stored one) runs on `device`. Raises `ModelDirError` naming what is wrong."""
    path = Path(path)
    if not path.is_dir():
        raise ModelDirError(f"{path} is not a directory: point --model at a Hugging Face model directory")
    info = read_config(path)
    weight_files(path)
    if not (path / TOKENIZER_FILE).is_file():
        raise ModelDirError(
            f"{path / TOKENIZER_FILE} not found: the model needs its fast tokenizer (tokenizer.json); "
            "save it with `AutoTokenizer.from_pretrained(...).save_pretrained(DIR)`"
        )
    chat_template_text(path)
    check_runnable_dtype(dtype or info.dtype, device)
    return info
