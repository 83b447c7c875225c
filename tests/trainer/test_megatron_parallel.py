"""The megatron backend's parallel layout and tensor-parallel shards (pure; no megatron, no GPU).

What megatron's layers hold per tensor-parallel rank is checked against the HF weights it
comes from: a rank's fused QKV rows are whole query groups, its fc1 is [gate rows; up rows]
of its slice of the MLP, the row-parallel layers hold column slices, and gathering every
rank's shard gives back the whole state. `scripts/megatron_cpu_parity.py` under torchrun runs
megatron-core itself on these shards (2 gloo ranks on CPU)."""

from __future__ import annotations

import pytest
import torch

from trainer.megatron_convert import hf_to_megatron
from trainer.megatron_parallel import (
    LayoutError,
    ParallelLayout,
    parallel_layout,
    tp_join,
    tp_shard,
    tp_split,
)
from trainer.model import ModelConfig, build_model
from trainer.settings import MegatronSettings

from .test_megatron_convert import ALL_BIASES, GQA, QWEN2_LIKE, QWEN3_LIKE, SMOLLM2_LIKE

LAYER = "decoder.layers.1"


def _even(config: ModelConfig) -> ModelConfig:
    """`config` with a vocabulary and an MLP that 2 and 3 divide."""
    return ModelConfig(**{**config.__dict__, "vocab_size": 96, "intermediate_size": 96})


def test_the_world_is_tensor_times_pipeline_times_data_parallel() -> None:
    assert parallel_layout(MegatronSettings(tensor_parallel=2), 4, _even(GQA)) == ParallelLayout(2, 1, 2, 1)
    assert parallel_layout(MegatronSettings(), 3, GQA) == ParallelLayout(1, 1, 3, 1)
    assert parallel_layout(MegatronSettings(tensor_parallel=2, data_parallel=1), 2, _even(GQA)).data == 1


@pytest.mark.parametrize(
    ("settings", "world", "config", "said"),
    [
        (
            MegatronSettings(tensor_parallel=2),
            3,
            GQA,
            "3 ranks are not a multiple of .*tensor_parallel \\(2\\)",
        ),
        (
            MegatronSettings(data_parallel=2),
            4,
            GQA,
            "data_parallel = 2, but 4 ranks .* = 4: set it to 4 or 0",
        ),
        (MegatronSettings(pipeline_parallel=2), 2, GQA, "pipeline stages are not built"),
        (MegatronSettings(expert_parallel=2), 2, GQA, "dense model, it has no experts"),
        # SmolLM2: 9 heads, 3 kv heads: tensor parallel 2 cannot split its query groups
        (
            MegatronSettings(tensor_parallel=2),
            2,
            SMOLLM2_LIKE,
            "num_key_value_heads 3, num_attention_heads 9",
        ),
        (MegatronSettings(tensor_parallel=2), 2, GQA, "vocab_size 97"),
    ],
    ids=["not-a-multiple", "data-parallel", "pipeline", "experts", "query-groups", "vocab"],
)
def test_layouts_that_cannot_run_are_refused_naming_the_setting(
    settings: MegatronSettings, world: int, config: ModelConfig, said: str
) -> None:
    with pytest.raises(LayoutError, match=said):
        parallel_layout(settings, world, config)


@pytest.mark.parametrize(
    "config", [GQA, QWEN2_LIKE, QWEN3_LIKE, ALL_BIASES], ids=["gqa", "qwen2", "qwen3", "biases"]
)
def test_every_rank_holds_its_slice_and_the_slices_join_back(config: ModelConfig) -> None:
    config = _even(config)
    hf = build_model(config, seed=4).state_dict()
    whole = hf_to_megatron(hf, config)
    shards = [tp_shard(whole, rank, 2) for rank in range(2)]
    for name, tensor in whole.items():
        assert torch.equal(tp_join(name, [shard[name] for shard in shards]), tensor), name
    groups, per_group = config.num_kv_heads // 2, config.num_heads // config.num_kv_heads
    head = config.head_dim
    hf_layer = "model.layers.1"
    for rank, shard in enumerate(shards):
        qkv = shard[f"{LAYER}.self_attention.linear_qkv.weight"]
        assert qkv.shape[0] == groups * (per_group + 2) * head
        first_group = rank * groups  # its first query group: the q rows of that group's heads, then k, then v
        q_rows = hf[f"{hf_layer}.self_attn.q_proj.weight"][first_group * per_group * head :][
            : per_group * head
        ]
        k_rows = hf[f"{hf_layer}.self_attn.k_proj.weight"][first_group * head :][:head]
        assert torch.equal(qkv[: per_group * head], q_rows)
        assert torch.equal(qkv[per_group * head :][:head], k_rows)
        fc1 = shard[f"{LAYER}.mlp.linear_fc1.weight"]
        half = config.intermediate_size // 2
        assert torch.equal(fc1[:half], hf[f"{hf_layer}.mlp.gate_proj.weight"][rank * half :][:half])
        assert torch.equal(fc1[half:], hf[f"{hf_layer}.mlp.up_proj.weight"][rank * half :][:half])
        proj = shard[f"{LAYER}.self_attention.linear_proj.weight"]
        columns = config.num_heads * head // 2
        assert torch.equal(proj, hf[f"{hf_layer}.self_attn.o_proj.weight"][:, rank * columns :][:, :columns])
        fc2 = shard[f"{LAYER}.mlp.linear_fc2.weight"]
        assert torch.equal(fc2, hf[f"{hf_layer}.mlp.down_proj.weight"][:, rank * half :][:, :half])
        vocab = shard["embedding.word_embeddings.weight"]
        assert torch.equal(vocab, hf["model.embed_tokens.weight"][rank * 48 :][:48])
        norm = shard[f"{LAYER}.self_attention.linear_qkv.layer_norm_weight"]
        assert torch.equal(norm, hf[f"{hf_layer}.input_layernorm.weight"])  # norms are whole on every rank


def test_three_way_split_of_the_real_model_shape_joins_back() -> None:
    """SmolLM2's shape (9 heads, 3 kv heads) splits at tensor parallel 3, not 2."""
    config = _even(SMOLLM2_LIKE)
    assert parallel_layout(MegatronSettings(tensor_parallel=3), 3, config).tensor == 3
    whole = hf_to_megatron(build_model(config, seed=5).state_dict(), config)
    shards = [tp_shard(whole, rank, 3) for rank in range(3)]
    assert all(torch.equal(tp_join(n, [s[n] for s in shards]), t) for n, t in whole.items())
    assert (
        tp_split("decoder.final_layernorm.weight", whole["decoder.final_layernorm.weight"], 3)[2]
        is (whole["decoder.final_layernorm.weight"])
    )
