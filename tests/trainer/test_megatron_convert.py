"""HF ↔ megatron-core weight conversion (trainer.megatron_convert); the megatron backend's import safety."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F

from trainer.megatron_convert import (
    EXTRA_STATE_SUFFIX,
    ConversionError,
    hf_to_megatron,
    megatron_shapes,
    megatron_to_hf,
)
from trainer.model import ModelConfig, build_model

GQA = ModelConfig(
    vocab_size=97,
    hidden_size=64,
    num_layers=3,
    num_heads=8,
    num_kv_heads=2,
    intermediate_size=80,
    max_position=128,
)


def _assert_near(actual: torch.Tensor, expected: torch.Tensor) -> None:
    # Not torch.testing.assert_close: its first call imports for ~45 s on the shared machine.
    assert actual.shape == expected.shape
    gap = float((actual - expected).detach().abs().max())
    assert gap <= 1e-5, f"max |difference| {gap}"


def _config(num_heads: int, num_kv_heads: int) -> ModelConfig:
    return ModelConfig(
        vocab_size=97,
        hidden_size=64,
        num_layers=3,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=80,
        max_position=128,
    )


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (8, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
def test_round_trip_gives_equal_tensors(heads: int, kv_heads: int) -> None:
    config = _config(heads, kv_heads)
    hf = build_model(config, seed=3).state_dict()
    megatron = hf_to_megatron(hf, config)
    assert {k: tuple(v.shape) for k, v in megatron.items()} == megatron_shapes(config)
    back = megatron_to_hf(megatron, config)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    # New tensors, not views: training the megatron copy must not move the HF weights.
    megatron["decoder.layers.0.self_attention.linear_qkv.weight"].add_(1.0)
    assert torch.equal(
        megatron_to_hf(hf_to_megatron(hf, config), config)["lm_head.weight"], hf["lm_head.weight"]
    )
    assert not torch.equal(
        megatron_to_hf(megatron, config)["model.layers.0.self_attn.q_proj.weight"],
        hf["model.layers.0.self_attn.q_proj.weight"],
    )


def _megatron_split(mixed: torch.Tensor, config: ModelConfig) -> tuple[torch.Tensor, ...]:
    """What megatron-core's `SelfAttention.get_query_key_value_tensors` does to `linear_qkv`'s output
    (0.16.1, no output gate, TP=1): view as (…, groups, (heads/groups + 2) * head_dim), split
    [heads/groups * head_dim, head_dim, head_dim], reshape the query to (…, heads, head_dim)."""
    groups, head_dim = config.num_kv_heads, config.head_dim
    per_group = config.num_heads // groups
    grouped = mixed.view(*mixed.shape[:-1], groups, (per_group + 2) * head_dim)
    query, key, value = torch.split(grouped, [per_group * head_dim, head_dim, head_dim], dim=-1)
    return query.reshape(*mixed.shape[:-1], -1, head_dim), key, value


def test_fused_qkv_split_per_group_reproduces_the_projections() -> None:
    model = build_model(GQA, seed=5)
    megatron = hf_to_megatron(model.state_dict(), GQA)
    x = torch.randn(2, 7, GQA.hidden_size, generator=torch.Generator().manual_seed(0))
    for i, layer in enumerate(model.model.layers):
        mixed = x @ megatron[f"decoder.layers.{i}.self_attention.linear_qkv.weight"].T
        query, key, value = _megatron_split(mixed, GQA)
        attn = layer.self_attn
        shape = (2, 7, -1, GQA.head_dim)
        _assert_near(query, attn.q_proj(x).view(shape))
        _assert_near(key, attn.k_proj(x).view(shape))
        _assert_near(value, attn.v_proj(x).view(shape))
        # Query head h must sit in group h // (heads / kv_heads), the kv head it attends with (GQA).
        per_group = GQA.num_heads // GQA.num_kv_heads
        q_heads = attn.q_proj(x).view(shape)
        for head in range(GQA.num_heads):
            group, slot = divmod(head, per_group)
            grouped = mixed.view(2, 7, GQA.num_kv_heads, -1)[:, :, group]
            in_group = grouped[..., slot * GQA.head_dim : (slot + 1) * GQA.head_dim]
            _assert_near(in_group, q_heads[:, :, head])
    # The check can fail: a plain [q; k; v] concatenation is not what megatron reads under GQA.
    attn = model.model.layers[0].self_attn
    plain = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    query, _, _ = _megatron_split(x @ plain.T, GQA)
    assert float((query - attn.q_proj(x).view(2, 7, -1, GQA.head_dim)).detach().abs().max()) > 1e-3


def test_fused_fc1_is_gate_then_up_as_megatron_glu_reads_it() -> None:
    model = build_model(GQA, seed=6)
    megatron = hf_to_megatron(model.state_dict(), GQA)
    x = torch.randn(3, GQA.hidden_size, generator=torch.Generator().manual_seed(1))
    for i, layer in enumerate(model.model.layers):
        fc1_out = x @ megatron[f"decoder.layers.{i}.mlp.linear_fc1.weight"].T
        x_glu, x_linear = torch.chunk(fc1_out, 2, dim=-1)  # megatron-core transformer/mlp.py `glu`
        fc2 = megatron[f"decoder.layers.{i}.mlp.linear_fc2.weight"]
        _assert_near((F.silu(x_glu) * x_linear) @ fc2.T, layer.mlp(x))


def test_transformer_engine_extra_state_is_ignored() -> None:
    hf = build_model(GQA, seed=1).state_dict()
    megatron = hf_to_megatron(hf, GQA)
    megatron["decoder.layers.0.self_attention.linear_qkv" + EXTRA_STATE_SUFFIX] = torch.empty(0)
    assert megatron_to_hf(megatron, GQA).keys() == hf.keys()


def test_missing_and_unexpected_keys_are_named() -> None:
    hf = build_model(GQA, seed=1).state_dict()
    del hf["model.layers.2.mlp.up_proj.weight"]
    hf["model.layers.3.mlp.up_proj.weight"] = torch.zeros(GQA.intermediate_size, GQA.hidden_size)
    with pytest.raises(ConversionError, match=r"missing \['model.layers.2.mlp.up_proj.weight'\]") as error:
        hf_to_megatron(hf, GQA)
    assert "unexpected ['model.layers.3.mlp.up_proj.weight']" in str(error.value)
    megatron = hf_to_megatron(build_model(GQA, seed=1).state_dict(), GQA)
    del megatron["output_layer.weight"]
    with pytest.raises(ConversionError, match=r"megatron state dict .* missing \['output_layer.weight'\]"):
        megatron_to_hf(megatron, GQA)


def test_wrong_shapes_are_named_with_the_expected_shape() -> None:
    other = _config(8, 4)  # more kv heads: k/v and the fused QKV are taller
    with pytest.raises(ConversionError, match=r"k_proj.weight: \(32, 64\) \(expected \(16, 64\)\)"):
        hf_to_megatron(build_model(other, seed=0).state_dict(), GQA)
    with pytest.raises(ConversionError, match=r"linear_qkv.weight: \(128, 64\) \(expected \(96, 64\)\)"):
        megatron_to_hf(hf_to_megatron(build_model(other, seed=0).state_dict(), other), GQA)


@pytest.mark.skipif(importlib.util.find_spec("megatron") is not None, reason="megatron-core installed")
def test_megatron_backend_without_megatron_says_what_to_install() -> None:
    import trainer.megatron_backend as backend_module  # importing must work without megatron-core
    from trainer.settings import TrainerSettings

    settings = TrainerSettings(backend="megatron", device="cuda")
    with pytest.raises(backend_module.MegatronUnavailable, match=r"pip install '.\[gpu\]'.*torchrun"):
        backend_module.MegatronBackend(build_model(GQA, seed=0), settings, lr=1e-6)
