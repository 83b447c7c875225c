"""Helpers of the megatron conversion tests: what megatron-core computes from its own weight names.

`megatron_split` and `reference_logits` write out in plain torch what megatron-core 0.16.1's
GPTModel (TE layer spec, TP=PP=1, fp32, no rope scaling) does with a state dict under its names:
models/gpt/gpt_model.py (embedding; output layer, or the embedding itself when
`share_embeddings_and_output_weights`), transformer/attention.py (`linear_qkv` with its fused
RMSNorm and bias, `get_query_key_value_tensors`' split per query group, `q_layernorm` /
`k_layernorm` before rotary, `linear_proj`), transformer/dot_product_attention.py (each group's
k/v repeated for its `heads / groups` query heads, scale 1/sqrt(kv_channels)), transformer/mlp.py
(`linear_fc1` with its fused RMSNorm, bias added before `glu`, `linear_fc2`). The tests compare
it with `PolicyModel` on the converted weights; scripts/megatron_cpu_parity.py compares megatron
itself (and rope scaling) where megatron-core is importable.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from trainer.model import ModelConfig


def megatron_split(
    mixed: torch.Tensor, config: ModelConfig
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`get_query_key_value_tensors` on `linear_qkv`'s output (…, rows): view as (…, groups,
    (heads/groups + 2) * head_dim), split [heads/groups * head_dim, head_dim, head_dim], query
    reshaped to (…, heads, head_dim); key and value (…, groups, head_dim)."""
    groups, head_dim = config.num_kv_heads, config.head_dim
    per_group = config.num_heads // groups
    grouped = mixed.view(*mixed.shape[:-1], groups, (per_group + 2) * head_dim)
    query, key, value = torch.split(grouped, [per_group * head_dim, head_dim, head_dim], dim=-1)
    return query.reshape(*mixed.shape[:-1], -1, head_dim), key, value


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _linear(x: torch.Tensor, state: Mapping[str, torch.Tensor], name: str) -> torch.Tensor:
    """`name`.weight applied to x, plus `name`.bias where the state has one."""
    return F.linear(x, state[f"{name}.weight"], state.get(f"{name}.bias"))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary (`rotary_interleaved=False`) of x (B, T, heads, head_dim)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def _attention(
    x: torch.Tensor, state: Mapping[str, torch.Tensor], prefix: str, config: ModelConfig
) -> torch.Tensor:
    batch, length, _ = x.shape
    eps, head_dim = config.rms_norm_eps, config.head_dim
    normed = _rms(x, state[f"{prefix}.linear_qkv.layer_norm_weight"], eps)
    query, key, value = megatron_split(_linear(normed, state, f"{prefix}.linear_qkv"), config)
    if f"{prefix}.q_layernorm.weight" in state:
        query = _rms(query, state[f"{prefix}.q_layernorm.weight"], eps)
        key = _rms(key, state[f"{prefix}.k_layernorm.weight"], eps)
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)[None, :, None, :]
    query, key = _rotate(query, angles.cos(), angles.sin()), _rotate(key, angles.cos(), angles.sin())
    per_group = config.num_heads // config.num_kv_heads
    key, value = key.repeat_interleave(per_group, dim=2), value.repeat_interleave(per_group, dim=2)
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal=True
    )
    return _linear(out.transpose(1, 2).reshape(batch, length, -1), state, f"{prefix}.linear_proj")


def _mlp(
    x: torch.Tensor, state: Mapping[str, torch.Tensor], prefix: str, config: ModelConfig
) -> torch.Tensor:
    normed = _rms(x, state[f"{prefix}.linear_fc1.layer_norm_weight"], config.rms_norm_eps)
    x_glu, x_linear = torch.chunk(_linear(normed, state, f"{prefix}.linear_fc1"), 2, dim=-1)
    return _linear(F.silu(x_glu) * x_linear, state, f"{prefix}.linear_fc2")


def reference_logits(
    state: Mapping[str, torch.Tensor], config: ModelConfig, ids: torch.Tensor
) -> torch.Tensor:
    """Logits (B, T, V) of a megatron-named state dict, computed as the module docstring says."""
    if config.rope_scaling is not None:
        raise ValueError(
            "the reference forward has no rope scaling (scripts/megatron_cpu_parity.py checks it)"
        )
    embedding = state["embedding.word_embeddings.weight"]
    x = embedding[ids]
    for i in range(config.num_layers):
        x = x + _attention(x, state, f"decoder.layers.{i}.self_attention", config)
        x = x + _mlp(x, state, f"decoder.layers.{i}.mlp", config)
    x = _rms(x, state["decoder.final_layernorm.weight"], config.rms_norm_eps)
    output = embedding if config.tie_word_embeddings else state["output_layer.weight"]
    return x @ output.T
