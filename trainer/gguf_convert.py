"""One GGUF file -> a plain Hugging Face model directory.

`convert_gguf(gguf_file, out_dir, architecture)` loads the GGUF's weights with
`transformers` (the `gguf` package reads the file; quantized tensors are dequantized to
fp32), copies them into a fresh model of `architecture` (a GGUF-loaded model refuses
`save_pretrained`) and writes into `out_dir`, which must not exist yet:

- `config.json` without `quantization_config` (nothing is quantized any more), with the
  rope settings both as transformers 5 writes them (`rope_parameters`) and as published
  checkpoints have them (top-level `rope_theta`, `rope_scaling`): transformers 4.x (and
  so SGLang) reads only the latter and would silently run rope_theta 10,000 without it;
- `model.safetensors` in fp32: the dequantized tensors bit for bit, checked after writing;
- `generation_config.json` with the bos/eos/pad ids of the GGUF metadata;
- the tokenizer files, built from the GGUF metadata by `trainer.gguf_tokenizer` (not by
  transformers' GGUF tokenizer conversion, which differs from the model's tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel

from trainer.gguf_tokenizer import (
    GgufTokenizer,
    GgufTokenizerError,
    read_gguf_tokenizer,
    write_tokenizer_files,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
StageFn = Callable[[str], None]


class ConversionError(RuntimeError):
    """The GGUF file cannot be converted faithfully; the message says what differs."""


@dataclass(frozen=True)
class Conversion:
    """What a conversion wrote: special tokens by name ({"token", "id"}), and the model's size."""

    special_tokens: dict[str, dict[str, Any]]
    parameters: int


def convert_gguf(
    gguf_file: Path, out_dir: Path, architecture: str, stage: StageFn | None = None
) -> Conversion:
    """Write the Hugging Face directory of `gguf_file` into `out_dir` (created here)."""
    notify = stage or (lambda what: None)
    model_class = _architecture_class(architecture)
    notify("reading the tokenizer")
    try:
        tokenizer = read_gguf_tokenizer(gguf_file)
    except GgufTokenizerError as error:
        raise ConversionError(str(error)) from None
    notify("reading and dequantizing the weights")
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
    )
    if type(loaded) is not model_class:
        raise ConversionError(f"{gguf_file.name} loads as {type(loaded).__name__}, not {architecture}")
    notify("writing the Hugging Face directory")
    model = _plain_copy(loaded, model_class, _generation_config(tokenizer))
    out_dir.mkdir(parents=False, exist_ok=False)
    model.save_pretrained(out_dir)
    _check_weights(out_dir / WEIGHTS_FILE, loaded)
    _add_published_rope_fields(out_dir / CONFIG_FILE)
    write_tokenizer_files(tokenizer, out_dir, model.config.max_position_embeddings)
    _readable_by_all(out_dir)
    specials = {name: {"token": tokenizer.token(name), "id": i} for name, i in tokenizer.special_ids.items()}
    return Conversion(specials, loaded.num_parameters())


def _architecture_class(architecture: str) -> type[PreTrainedModel]:
    model_class = getattr(transformers, architecture, None)
    if not (isinstance(model_class, type) and issubclass(model_class, PreTrainedModel)):
        raise ConversionError(f"transformers {transformers.__version__} has no model class {architecture}")
    return model_class


def _generation_config(tokenizer: GgufTokenizer) -> GenerationConfig:
    """bos, eos (where generation stops) and pad as the GGUF metadata names them."""
    ids = tokenizer.special_ids
    if "eos_token" not in ids:
        raise ConversionError(
            "the GGUF names no eos token (tokenizer.ggml.eos_token_id): where would it stop?"
        )
    return GenerationConfig(
        bos_token_id=ids.get("bos_token"), eos_token_id=ids["eos_token"], pad_token_id=ids.get("pad_token")
    )


def _plain_copy(
    loaded: PreTrainedModel, model_class: type[PreTrainedModel], generation: GenerationConfig
) -> PreTrainedModel:
    """A model `save_pretrained` accepts, with the GGUF model's tensors and no quantization config."""
    config = loaded.config.__class__.from_dict(loaded.config.to_dict())
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = model_class(config)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    # a tied output head is absent from the GGUF and present in the fresh model's keys
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ConversionError(
            f"weights do not fit {model_class.__name__}: missing {missing}, extra {unexpected}"
        )
    model.generation_config = generation
    return model.eval()


def _check_weights(path: Path, loaded: PreTrainedModel) -> None:
    """Every written tensor equals the dequantized GGUF tensor of that name, bit for bit."""
    source = loaded.state_dict()
    for name, tensor in load_file(path).items():
        if tensor.dtype != torch.float32 or not torch.equal(tensor, source[name]):
            raise ConversionError(f"{path.name}: {name} differs from the GGUF's dequantized tensor")


def _add_published_rope_fields(path: Path) -> None:
    """`rope_theta` (and `rope_scaling` when not the default rope) at the top level as well;
    transformers 4 writes them there already, and no `rope_parameters`."""
    config = json.loads(path.read_text())
    if "rope_parameters" not in config and "rope_theta" in config:
        return
    rope = dict(config.get("rope_parameters") or {})
    if "rope_theta" not in rope:
        raise ConversionError(f"{path.name}: no rope_theta in rope_parameters ({rope}) or at the top level")
    config["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = rope
    _write_json(path, config)


def _readable_by_all(directory: Path) -> None:
    """Files readable by all (transformers saves the weights 0600): an engine or a trainer
    running as another user loads them."""
    for path in directory.iterdir():
        path.chmod(0o644)


def _write_json(path: Path, content: dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n")
