"""Weights between our Hugging Face layout and megatron-core's GPTModel (pure torch, no megatron import).

Contract. `hf_to_megatron(state, config)` takes a `LlamaForCausalLM`-named state dict (what
`PolicyModel.state_dict()` and `model.safetensors` hold) and returns the state dict of a
megatron-core `GPTModel` built with the Transformer Engine layer spec
(`get_gpt_layer_with_transformer_engine_spec()`), tensor and pipeline parallel size 1;
`megatron_to_hf(state, config)` is its inverse. Both check every key and shape against
`config` and raise `ConversionError` naming what is missing, unexpected or mis-shaped.

Names (checked against megatron-core 0.16.1: models/gpt/gpt_model.py,
models/gpt/gpt_layer_specs.py, transformer/attention.py `get_query_key_value_tensors`,
transformer/mlp.py `glu`):

    model.embed_tokens.weight                 embedding.word_embeddings.weight
    model.layers.{i}.input_layernorm.weight   decoder.layers.{i}.self_attention.linear_qkv.layer_norm_weight
    q_proj, k_proj, v_proj                    decoder.layers.{i}.self_attention.linear_qkv.weight
    model.layers.{i}.self_attn.o_proj.weight  decoder.layers.{i}.self_attention.linear_proj.weight
    post_attention_layernorm.weight           decoder.layers.{i}.mlp.linear_fc1.layer_norm_weight
    gate_proj, up_proj                        decoder.layers.{i}.mlp.linear_fc1.weight
    model.layers.{i}.mlp.down_proj.weight     decoder.layers.{i}.mlp.linear_fc2.weight
    model.norm.weight                         decoder.final_layernorm.weight
    lm_head.weight                            output_layer.weight

The fused QKV weight is grouped per query group, as megatron splits it: for each kv head g,
the rows of the `num_heads / num_kv_heads` query heads of that group, then k_g, then v_g
(shape `(num_kv_heads * (heads_per_group + 2) * head_dim, hidden)`). The fused fc1 weight is
gate rows then up rows (megatron's `glu` takes `silu(first half) * second half`). The layer
norms are the RMSNorm weights fused into TE's `LayerNormLinear`.

Transformer Engine also puts `*._extra_state` entries (fp8 metadata, not weights) into a
GPTModel's state dict; `megatron_to_hf` ignores them and `hf_to_megatron` does not produce
them (load with `strict=False` and check the missing keys are only those; see
`trainer.megatron_backend`).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from trainer.model import ModelConfig

EXTRA_STATE_SUFFIX = "._extra_state"

Shapes = dict[str, tuple[int, ...]]


class ConversionError(ValueError):
    """A state dict that does not match the layout `config` describes."""


def _qkv_rows(config: ModelConfig) -> int:
    return (config.num_heads + 2 * config.num_kv_heads) * config.head_dim


def hf_shapes(config: ModelConfig) -> Shapes:
    """Every parameter of the HF layout and its shape."""
    hidden, head_dim, inter = config.hidden_size, config.head_dim, config.intermediate_size
    shapes: Shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_layers):
        prefix = f"model.layers.{i}"
        shapes[f"{prefix}.input_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.self_attn.q_proj.weight"] = (config.num_heads * head_dim, hidden)
        shapes[f"{prefix}.self_attn.k_proj.weight"] = (config.num_kv_heads * head_dim, hidden)
        shapes[f"{prefix}.self_attn.v_proj.weight"] = (config.num_kv_heads * head_dim, hidden)
        shapes[f"{prefix}.self_attn.o_proj.weight"] = (hidden, config.num_heads * head_dim)
        shapes[f"{prefix}.post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{prefix}.mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{prefix}.mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{prefix}.mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


def megatron_shapes(config: ModelConfig) -> Shapes:
    """Every parameter of the megatron-core GPTModel (TE spec, TP=PP=1) and its shape."""
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes: Shapes = {"embedding.word_embeddings.weight": (config.vocab_size, hidden)}
    for i in range(config.num_layers):
        attention, mlp = f"decoder.layers.{i}.self_attention", f"decoder.layers.{i}.mlp"
        shapes[f"{attention}.linear_qkv.layer_norm_weight"] = (hidden,)
        shapes[f"{attention}.linear_qkv.weight"] = (_qkv_rows(config), hidden)
        shapes[f"{attention}.linear_proj.weight"] = (hidden, config.num_heads * config.head_dim)
        shapes[f"{mlp}.linear_fc1.layer_norm_weight"] = (hidden,)
        shapes[f"{mlp}.linear_fc1.weight"] = (2 * inter, hidden)
        shapes[f"{mlp}.linear_fc2.weight"] = (hidden, inter)
    shapes["decoder.final_layernorm.weight"] = (hidden,)
    shapes["output_layer.weight"] = (config.vocab_size, hidden)
    return shapes


def _checked(state: Mapping[str, torch.Tensor], expected: Shapes, layout: str) -> None:
    """Raise ConversionError unless `state` has exactly the keys and shapes of `expected`."""
    keys = {k for k in state if not k.endswith(EXTRA_STATE_SUFFIX)}
    missing = sorted(set(expected) - keys)
    unexpected = sorted(keys - set(expected))
    if missing or unexpected:
        raise ConversionError(
            f"{layout} state dict does not match the model config: missing {missing[:8]}"
            f"{' …' if len(missing) > 8 else ''} ({len(missing)}), unexpected {unexpected[:8]}"
            f"{' …' if len(unexpected) > 8 else ''} ({len(unexpected)}); check that the weights belong "
            "to a model with these sizes (config.json / [model]) and tensor/pipeline parallel size 1"
        )
    wrong = [
        f"{k}: {tuple(state[k].shape)} (expected {shape})"
        for k, shape in expected.items()
        if tuple(state[k].shape) != shape
    ]
    if wrong:
        raise ConversionError(
            f"{layout} state dict has tensors of the wrong shape for the model config: {wrong[:8]}; "
            "the weights come from a model of other sizes"
        )


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: ModelConfig) -> torch.Tensor:
    """q/k/v projection weights → megatron's fused weight, grouped per query group."""
    groups, head_dim = config.num_kv_heads, config.head_dim
    per_group = config.num_heads // groups
    hidden = q.shape[-1]
    fused = torch.cat(
        [
            q.reshape(groups, per_group * head_dim, hidden),
            k.reshape(groups, head_dim, hidden),
            v.reshape(groups, head_dim, hidden),
        ],
        dim=1,
    )
    return fused.reshape(groups * (per_group + 2) * head_dim, hidden)


def split_qkv(qkv: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """megatron's fused QKV weight → (q_proj, k_proj, v_proj) weights; the inverse of `fuse_qkv`."""
    groups, head_dim = config.num_kv_heads, config.head_dim
    per_group = config.num_heads // groups
    hidden = qkv.shape[-1]
    grouped = qkv.reshape(groups, (per_group + 2) * head_dim, hidden)
    q, k, v = torch.split(grouped, [per_group * head_dim, head_dim, head_dim], dim=1)
    return (
        q.reshape(config.num_heads * head_dim, hidden),
        k.reshape(groups * head_dim, hidden),
        v.reshape(groups * head_dim, hidden),
    )


def _layer_prefixes(index: int) -> tuple[str, str, str]:
    """Layer `index`'s HF prefix, megatron attention prefix, megatron MLP prefix."""
    return f"model.layers.{index}", f"decoder.layers.{index}.self_attention", f"decoder.layers.{index}.mlp"


def hf_to_megatron(state: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A HF (`LlamaForCausalLM`-named) state dict → megatron-core GPTModel names (new tensors)."""
    _checked(state, hf_shapes(config), "HF")
    out = {
        "embedding.word_embeddings.weight": state["model.embed_tokens.weight"].clone(),
        "decoder.final_layernorm.weight": state["model.norm.weight"].clone(),
        "output_layer.weight": state["lm_head.weight"].clone(),
    }
    for i in range(config.num_layers):
        hf, attention, mlp = _layer_prefixes(i)
        out[f"{attention}.linear_qkv.layer_norm_weight"] = state[f"{hf}.input_layernorm.weight"].clone()
        out[f"{attention}.linear_qkv.weight"] = fuse_qkv(
            state[f"{hf}.self_attn.q_proj.weight"],
            state[f"{hf}.self_attn.k_proj.weight"],
            state[f"{hf}.self_attn.v_proj.weight"],
            config,
        )
        out[f"{attention}.linear_proj.weight"] = state[f"{hf}.self_attn.o_proj.weight"].clone()
        out[f"{mlp}.linear_fc1.layer_norm_weight"] = state[f"{hf}.post_attention_layernorm.weight"].clone()
        out[f"{mlp}.linear_fc1.weight"] = torch.cat(
            [state[f"{hf}.mlp.gate_proj.weight"], state[f"{hf}.mlp.up_proj.weight"]], dim=0
        )
        out[f"{mlp}.linear_fc2.weight"] = state[f"{hf}.mlp.down_proj.weight"].clone()
    return out


def megatron_to_hf(state: Mapping[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    """A megatron-core GPTModel state dict → HF names (new tensors; `_extra_state` entries ignored)."""
    _checked(state, megatron_shapes(config), "megatron")
    out = {
        "model.embed_tokens.weight": state["embedding.word_embeddings.weight"].clone(),
        "model.norm.weight": state["decoder.final_layernorm.weight"].clone(),
        "lm_head.weight": state["output_layer.weight"].clone(),
    }
    for i in range(config.num_layers):
        hf, attention, mlp = _layer_prefixes(i)
        out[f"{hf}.input_layernorm.weight"] = state[f"{attention}.linear_qkv.layer_norm_weight"].clone()
        q, k, v = split_qkv(state[f"{attention}.linear_qkv.weight"], config)
        out[f"{hf}.self_attn.q_proj.weight"] = q.clone()
        out[f"{hf}.self_attn.k_proj.weight"] = k.clone()
        out[f"{hf}.self_attn.v_proj.weight"] = v.clone()
        out[f"{hf}.self_attn.o_proj.weight"] = state[f"{attention}.linear_proj.weight"].clone()
        out[f"{hf}.post_attention_layernorm.weight"] = state[f"{mlp}.linear_fc1.layer_norm_weight"].clone()
        gate, up = torch.chunk(state[f"{mlp}.linear_fc1.weight"], 2, dim=0)
        out[f"{hf}.mlp.gate_proj.weight"] = gate.clone()
        out[f"{hf}.mlp.up_proj.weight"] = up.clone()
        out[f"{hf}.mlp.down_proj.weight"] = state[f"{mlp}.linear_fc2.weight"].clone()
    return out
