"""HF ↔ megatron-core weight conversion (trainer.megatron_convert) for every family `ModelConfig`
describes (tied SmolLM2-like GQA, Qwen2's q/k/v biases, Qwen3's q/k norm and head_dim, all
biases), what megatron cannot express refused, the megatron backend's arguments and import safety.
The real SmolLM2 weights: tests/trainer/test_smollm2_megatron.py."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch
import torch.nn.functional as F

from tests.trainer.megatron_reference import megatron_split, reference_logits
from trainer.hf_config import model_config_from_hf
from trainer.megatron_convert import (
    EXTRA_STATE_SUFFIX,
    ConversionError,
    hf_to_megatron,
    megatron_shapes,
    megatron_to_hf,
)
from trainer.model import ModelConfig, PolicyModel, RopeScaling, build_model

GQA = ModelConfig(
    vocab_size=97,
    hidden_size=64,
    num_layers=3,
    num_heads=8,
    num_kv_heads=2,
    intermediate_size=80,
    max_position=128,
)


def _hf(architecture: str, **extra: object) -> ModelConfig:
    """A tiny config as `trainer.hf_config` reads a config.json of that family."""
    raw = {
        "architectures": [architecture],
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 80,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 128,
        **extra,
    }
    return model_config_from_hf(raw)


# SmolLM2-135M scaled down: Llama, tied, GQA 9 heads / 3 kv heads, head_dim 8, rope_theta 1e5.
SMOLLM2_LIKE = _hf(
    "LlamaForCausalLM",
    hidden_size=72,
    num_attention_heads=9,
    num_key_value_heads=3,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)
QWEN2_LIKE = _hf("Qwen2ForCausalLM", tie_word_embeddings=True, rope_theta=1000000.0)
QWEN3_LIKE = _hf("Qwen3ForCausalLM", head_dim=24)  # 4 heads x 24 = 96, not hidden 64
ALL_BIASES = _hf("LlamaForCausalLM", attention_bias=True, mlp_bias=True)
FAMILIES = {
    "smollm2-like": SMOLLM2_LIKE,
    "qwen2-like": QWEN2_LIKE,
    "qwen3-like": QWEN3_LIKE,
    "all-biases": ALL_BIASES,
}


def test_the_family_configs_have_the_switches_they_are_named_for() -> None:
    assert SMOLLM2_LIKE.tie_word_embeddings and (SMOLLM2_LIKE.num_heads, SMOLLM2_LIKE.num_kv_heads) == (9, 3)
    assert QWEN2_LIKE.qkv_bias and not QWEN2_LIKE.o_bias and QWEN2_LIKE.tie_word_embeddings
    assert QWEN3_LIKE.qk_norm and QWEN3_LIKE.head_dim * QWEN3_LIKE.num_heads != QWEN3_LIKE.hidden_size
    assert ALL_BIASES.qkv_bias and ALL_BIASES.o_bias and ALL_BIASES.mlp_bias


def _random_model(config: ModelConfig, seed: int) -> PolicyModel:
    """Every parameter random (norm gains and biases too), so a swapped or mis-grouped tensor shows."""
    model = PolicyModel(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1.0 + 0.2 * noise if name.endswith("norm.weight") else 0.05 * noise)
    return model.eval()


def _assert_near(actual: torch.Tensor, expected: torch.Tensor, bound: float = 1e-5) -> None:
    # Not torch.testing.assert_close: its first call imports for ~45 s on the shared machine.
    assert actual.shape == expected.shape
    gap = float((actual - expected).detach().abs().max())
    assert gap <= bound, f"max |difference| {gap}"


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


def _assert_round_trip_exact(hf: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    megatron = hf_to_megatron(hf, config)
    assert {k: tuple(v.shape) for k, v in megatron.items()} == megatron_shapes(config)
    back = megatron_to_hf(megatron, config)
    assert back.keys() == hf.keys()
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    return megatron


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 2), (8, 1), (4, 4)], ids=["gqa", "mqa", "mha"])
def test_round_trip_gives_equal_tensors(heads: int, kv_heads: int) -> None:
    config = _config(heads, kv_heads)
    hf = build_model(config, seed=3).state_dict()
    megatron = _assert_round_trip_exact(hf, config)
    # New tensors, not views: training the megatron copy must not move the HF weights.
    megatron["decoder.layers.0.self_attention.linear_qkv.weight"].add_(1.0)
    assert torch.equal(
        megatron_to_hf(hf_to_megatron(hf, config), config)["lm_head.weight"], hf["lm_head.weight"]
    )
    assert not torch.equal(
        megatron_to_hf(megatron, config)["model.layers.0.self_attn.q_proj.weight"],
        hf["model.layers.0.self_attn.q_proj.weight"],
    )


@pytest.mark.parametrize("config", FAMILIES.values(), ids=FAMILIES.keys())
def test_round_trip_is_exact_for_every_family(config: ModelConfig) -> None:
    hf = _random_model(config, seed=4).state_dict()
    megatron = _assert_round_trip_exact(hf, config)
    assert ("output_layer.weight" in megatron) == (not config.tie_word_embeddings)
    layer = "decoder.layers.1.self_attention"
    if config.qk_norm:
        assert torch.equal(
            megatron[f"{layer}.q_layernorm.weight"], hf["model.layers.1.self_attn.q_norm.weight"]
        )
        assert torch.equal(
            megatron[f"{layer}.k_layernorm.weight"], hf["model.layers.1.self_attn.k_norm.weight"]
        )
    assert (f"{layer}.linear_qkv.bias" in megatron) == config.qkv_bias
    assert (f"{layer}.linear_proj.bias" in megatron) == config.o_bias


@pytest.mark.parametrize("config", FAMILIES.values(), ids=FAMILIES.keys())
def test_megatron_forward_on_converted_weights_equals_policy_model(config: ModelConfig) -> None:
    model = _random_model(config, seed=7)
    ids = torch.randint(0, config.vocab_size, (2, 24), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _assert_near(
            reference_logits(hf_to_megatron(model.state_dict(), config), config, ids), model(ids), 1e-4
        )


@pytest.mark.parametrize("config", [GQA, QWEN2_LIKE, QWEN3_LIKE], ids=["gqa", "qwen2-like", "qwen3-like"])
def test_fused_qkv_split_per_group_reproduces_the_projections(config: ModelConfig) -> None:
    model = _random_model(config, seed=5)
    megatron = hf_to_megatron(model.state_dict(), config)
    x = torch.randn(2, 7, config.hidden_size, generator=torch.Generator().manual_seed(0))
    shape = (2, 7, -1, config.head_dim)
    per_group = config.num_heads // config.num_kv_heads
    for i, layer in enumerate(model.model.layers):
        prefix = f"decoder.layers.{i}.self_attention.linear_qkv"
        mixed = F.linear(x, megatron[f"{prefix}.weight"], megatron.get(f"{prefix}.bias"))
        query, key, value = megatron_split(mixed, config)
        attn = layer.self_attn
        _assert_near(query, attn.q_proj(x).view(shape))
        _assert_near(key, attn.k_proj(x).view(shape))
        _assert_near(value, attn.v_proj(x).view(shape))
        # Query head h must sit in group h // (heads / kv_heads), the kv head it attends with (GQA).
        q_heads = attn.q_proj(x).view(shape)
        for head in range(config.num_heads):
            group, slot = divmod(head, per_group)
            grouped = mixed.view(2, 7, config.num_kv_heads, -1)[:, :, group]
            _assert_near(
                grouped[..., slot * config.head_dim : (slot + 1) * config.head_dim], q_heads[:, :, head]
            )
    # The check can fail: a plain [q; k; v] concatenation is not what megatron reads under GQA.
    attn = model.model.layers[0].self_attn
    plain = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    query, _, _ = megatron_split(x @ plain.T, config)
    assert float((query - F.linear(x, attn.q_proj.weight).view(shape)).detach().abs().max()) > 1e-3


def test_fused_fc1_is_gate_then_up_as_megatron_glu_reads_it() -> None:
    model = _random_model(ALL_BIASES, seed=6)
    megatron = hf_to_megatron(model.state_dict(), ALL_BIASES)
    x = torch.randn(3, ALL_BIASES.hidden_size, generator=torch.Generator().manual_seed(1))
    for i, layer in enumerate(model.model.layers):
        mlp = f"decoder.layers.{i}.mlp"
        fc1_out = F.linear(x, megatron[f"{mlp}.linear_fc1.weight"], megatron[f"{mlp}.linear_fc1.bias"])
        x_glu, x_linear = torch.chunk(fc1_out, 2, dim=-1)  # megatron-core transformer/mlp.py `glu`
        out = F.linear(
            F.silu(x_glu) * x_linear, megatron[f"{mlp}.linear_fc2.weight"], megatron[f"{mlp}.linear_fc2.bias"]
        )
        _assert_near(out, layer.mlp(x))


def test_tied_output_layer_is_the_embedding_and_a_different_head_is_refused() -> None:
    config = SMOLLM2_LIKE
    hf = _random_model(config, seed=8).state_dict()
    assert torch.equal(hf["lm_head.weight"], hf["model.embed_tokens.weight"])
    # As a tied checkpoint is stored (save_pretrained leaves lm_head out): same megatron weights.
    stored = {k: t for k, t in hf.items() if k != "lm_head.weight"}
    megatron = hf_to_megatron(stored, config)
    assert "output_layer.weight" not in megatron
    assert all(torch.equal(t, hf_to_megatron(hf, config)[k]) for k, t in megatron.items())
    back = megatron_to_hf(megatron, config)
    assert back["lm_head.weight"] is back["model.embed_tokens.weight"]
    untied = dict(hf, **{"lm_head.weight": hf["lm_head.weight"] + 1.0})
    with pytest.raises(ConversionError, match=r"tie_word_embeddings.*lm_head.weight differs"):
        hf_to_megatron(untied, config)
    with pytest.raises(ConversionError, match=r"unexpected \['output_layer.weight'\]"):
        megatron_to_hf(
            {**megatron, "output_layer.weight": megatron["embedding.word_embeddings.weight"]}, config
        )


@pytest.mark.parametrize(
    ("config", "named"),
    [
        (_hf("LlamaForCausalLM", attention_bias=True), r"o_bias=True, mlp_bias=False.*attention_bias"),
        (_hf("LlamaForCausalLM", mlp_bias=True), r"qkv_bias=False, o_bias=False, mlp_bias=True"),
        (
            _hf(
                "LlamaForCausalLM",
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 2.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
            ),
            r"llama3 rope scaling with \{'low_freq_factor': 2.0.*low_freq_factor, high_freq_factor",
        ),
    ],
    ids=["o-bias", "mlp-bias", "llama3-factors"],
)
def test_what_megatron_cannot_express_is_refused_naming_it(config: ModelConfig, named: str) -> None:
    from trainer.megatron_backend import MegatronBackend, gpt_model_kwargs, transformer_config_kwargs
    from trainer.settings import TrainerSettings

    hf = _random_model(config, seed=0).state_dict()
    for convert in (
        lambda: hf_to_megatron(hf, config),
        lambda: megatron_to_hf({}, config),
        lambda: transformer_config_kwargs(config),
        lambda: gpt_model_kwargs(config),
        # Before megatron is imported: the refusal shows on any machine.
        lambda: MegatronBackend(PolicyModel(config), TrainerSettings(backend="megatron"), lr=1e-6),
    ):
        with pytest.raises(ConversionError, match=named):
            convert()


def test_backend_arguments_follow_the_config() -> None:
    from trainer.megatron_backend import gpt_model_kwargs, transformer_config_kwargs

    qwen2, qwen3, biases = (transformer_config_kwargs(c) for c in (QWEN2_LIKE, QWEN3_LIKE, ALL_BIASES))
    assert (qwen2["add_qkv_bias"], qwen2["add_bias_linear"], qwen2["qk_layernorm"]) == (True, False, False)
    assert (qwen3["qk_layernorm"], qwen3["kv_channels"], qwen3["add_qkv_bias"]) == (True, 24, False)
    assert biases["add_bias_linear"] and biases["add_qkv_bias"]
    smol = gpt_model_kwargs(SMOLLM2_LIKE)
    assert smol["share_embeddings_and_output_weights"] and smol["rotary_base"] == 100000.0
    assert not smol["rope_scaling"] and smol["seq_len_interpolation_factor"] is None
    assert not gpt_model_kwargs(QWEN3_LIKE)["share_embeddings_and_output_weights"]
    # Rope scaling megatron can express (scripts/megatron_cpu_parity.py checks the logits).
    linear = gpt_model_kwargs(dataclasses.replace(GQA, rope_scaling=RopeScaling("linear", 4.0)))
    assert (linear["seq_len_interpolation_factor"], linear["rope_scaling"]) == (4.0, False)
    llama3 = gpt_model_kwargs(dataclasses.replace(GQA, rope_scaling=RopeScaling("llama3", 32.0)))
    assert (
        llama3["rope_scaling"],
        llama3["rope_scaling_factor"],
        llama3["seq_len_interpolation_factor"],
    ) == (
        True,
        32.0,
        None,
    )


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
    # Biases of another family: a Llama state dict is not a Qwen2 one.
    with pytest.raises(ConversionError, match=r"missing \['model.layers.0.self_attn.k_proj.bias'"):
        hf_to_megatron(
            build_model(dataclasses.replace(QWEN2_LIKE, qkv_bias=False), seed=0).state_dict(), QWEN2_LIKE
        )


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
    for config in (GQA, SMOLLM2_LIKE, QWEN3_LIKE):
        with pytest.raises(backend_module.MegatronUnavailable, match=r"pip install '.\[gpu\]'.*torchrun"):
            backend_module.MegatronBackend(build_model(config, seed=0), settings, lr=1e-6)
