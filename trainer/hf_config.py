"""Hugging Face `config.json` to `ModelConfig`: which checkpoints we run, and a clear refusal of the rest.

Supported: `LlamaForCausalLM`, `Qwen2ForCausalLM` (biases on q/k/v) and `Qwen3ForCausalLM`
(RMSNorm of q and k per head; `head_dim` need not be hidden / heads), with GQA, tied or untied
embeddings, and rotary scaling of type `default`, `linear` or `llama3`. Rope settings are read
where either generation of `transformers` writes them: top-level `rope_theta` / `rope_scaling`
(published checkpoints) or `rope_parameters` (transformers 5).

Anything else (another architecture, rope type, activation, sliding-window attention, partial
rotary) raises `UnsupportedModelError` naming the file and field: a model we would run wrongly
is never loaded. Pure: dict in, config out.
"""

from __future__ import annotations

from typing import Any

from trainer.model import ModelConfig, RopeScaling

# architecture -> (model_type, q/k/v bias rule, q/k norm)
FAMILIES: dict[str, tuple[str, str, bool]] = {
    "LlamaForCausalLM": ("llama", "attention_bias", False),
    "Qwen2ForCausalLM": ("qwen2", "qkv", False),
    "Qwen3ForCausalLM": ("qwen3", "attention_bias", True),
}
ARCHITECTURE_BY_TYPE = {model_type: arch for arch, (model_type, _, _) in FAMILIES.items()}
ROPE_TYPES = ("default", "linear", "llama3")
DTYPES = ("float32", "bfloat16", "float16")


class UnsupportedModelError(ValueError):
    """A config we cannot run faithfully; the message names the file, the field and what to do."""


def model_config_from_hf(raw: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """The `ModelConfig` of a Hugging Face config dict; `source` names the file in errors."""
    architecture = architecture_of(raw, source)
    _, bias_rule, qk_norm = FAMILIES[architecture]
    _refuse_unsupported_attention(raw, source)
    theta, scaling = rope_settings(raw, source)
    attention_bias = bool(raw.get("attention_bias", False))
    heads = _required(raw, "num_attention_heads", source)
    try:
        return ModelConfig(
            vocab_size=_required(raw, "vocab_size", source),
            hidden_size=_required(raw, "hidden_size", source),
            num_layers=_required(raw, "num_hidden_layers", source),
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            intermediate_size=_required(raw, "intermediate_size", source),
            max_position=_required(raw, "max_position_embeddings", source),
            rope_theta=theta,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            head_dim=raw.get("head_dim") or 0,
            rope_scaling=scaling,
            qkv_bias=attention_bias if bias_rule == "attention_bias" else True,
            o_bias=attention_bias if bias_rule == "attention_bias" else False,
            mlp_bias=bool(raw.get("mlp_bias", False)) if architecture == "LlamaForCausalLM" else False,
            qk_norm=qk_norm,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            architecture=architecture,
        )
    except ValueError as error:
        raise UnsupportedModelError(f"{source}: {error}") from error


def architecture_of(raw: dict[str, Any], source: str) -> str:
    architectures = raw.get("architectures") or []
    if not architectures and raw.get("model_type") in ARCHITECTURE_BY_TYPE:
        return ARCHITECTURE_BY_TYPE[raw["model_type"]]
    if len(architectures) != 1 or architectures[0] not in FAMILIES:
        raise UnsupportedModelError(
            f"{source}: field `architectures` is {architectures!r}; supported: {', '.join(FAMILIES)}. "
            "Convert the checkpoint to one of these families or use another model"
        )
    return architectures[0]


def rope_settings(raw: dict[str, Any], source: str) -> tuple[float, RopeScaling | None]:
    """(rope_theta, scaling) from `rope_parameters` or from `rope_theta` + `rope_scaling`."""
    if isinstance(raw.get("rope_parameters"), dict):
        params, field = raw["rope_parameters"], "rope_parameters"
        theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    else:
        params, field = raw.get("rope_scaling") or {}, "rope_scaling"
        theta = raw.get("rope_theta", 10000.0)
    if float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 1.0))) != 1.0:
        raise UnsupportedModelError(f"{source}: field `partial_rotary_factor` must be 1 (rotary on all dims)")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"{source}: field `{field}.rope_type` is {kind!r}; supported: {', '.join(ROPE_TYPES)}"
        )
    if kind == "default":
        return float(theta), None
    factor = float(_required(params, "factor", f"{source} `{field}`"))
    if kind == "linear":
        return float(theta), RopeScaling("linear", factor)
    where = f"{source} `{field}`"
    return float(theta), RopeScaling(
        "llama3",
        factor,
        low_freq_factor=float(_required(params, "low_freq_factor", where)),
        high_freq_factor=float(_required(params, "high_freq_factor", where)),
        original_max_position=int(_required(params, "original_max_position_embeddings", where)),
    )


def stored_dtype(raw: dict[str, Any], source: str = "config.json") -> str:
    """The dtype the checkpoint's weights are stored in (`dtype`, or `torch_dtype` before transformers 5)."""
    name = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    if name not in DTYPES:
        raise UnsupportedModelError(f"{source}: field `dtype` is {name!r}; supported: {', '.join(DTYPES)}")
    return str(name)


def _refuse_unsupported_attention(raw: dict[str, Any], source: str) -> None:
    act = raw.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"{source}: field `hidden_act` is {act!r}; only 'silu' (SwiGLU) runs")
    if raw.get("use_sliding_window"):
        raise UnsupportedModelError(
            f"{source}: field `use_sliding_window` is true; sliding-window attention is not supported"
        )
    other_layers = sorted({t for t in raw.get("layer_types") or [] if t != "full_attention"})
    if other_layers:
        raise UnsupportedModelError(f"{source}: field `layer_types` has {other_layers}; only full attention")


def _required(raw: dict[str, Any], key: str, source: str) -> Any:
    if raw.get(key) is None:
        raise UnsupportedModelError(f"{source}: field `{key}` is missing")
    return raw[key]
