"""Our model against `transformers` on tiny random checkpoints of every supported family.

Each checkpoint is made with transformers' own config class and `save_pretrained` (nothing is
downloaded), with every parameter drawn at random (biases and norm gains too, so those paths
count), and loaded by `trainer.checkpoint.load_model`. The logits of our full forward and of our
cached path (prefill, then one token at a time) must agree with transformers' to 1e-4 in fp32.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import ModelDirError, load_model, read_config
from trainer.model import KVCache, PolicyModel

# Measured on the five configs below (logits up to ~2.8): fp32 full forward 0 (bit-identical), cached
# path <= 1.5e-6; bf16 against transformers in bf16: full forward 0, cached path <= 0.023 (the cache
# is bf16 and attention runs with a mask instead of the causal kernel); bf16 vs fp32 <= 0.045.
FP32_BOUND = 1e-4
BF16_BOUND = 0.05


def _llama(**extra: object) -> object:
    from transformers import LlamaConfig

    base = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaConfig(**{**base, **extra})


def _qwen2(**extra: object) -> object:
    from transformers import Qwen2Config

    base = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    return Qwen2Config(**{**base, **extra})


def _qwen3(**extra: object) -> object:
    from transformers import Qwen3Config

    base = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=24,  # not hidden / heads (16), as Qwen3 checkpoints have
        max_position_embeddings=256,
    )
    return Qwen3Config(**{**base, **extra})


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}

CASES: dict[str, Callable[[], object]] = {
    "llama-gqa": lambda: _llama(),
    "llama-tied-llama3-rope": lambda: _llama(tie_word_embeddings=True, rope_parameters=LLAMA3_ROPE),
    "llama-linear-rope-bias": lambda: _llama(
        rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        attention_bias=True,
        mlp_bias=True,
    ),
    "qwen2-qkv-bias-tied": lambda: _qwen2(),
    "qwen3-head-dim-qk-norm": lambda: _qwen3(),
}


def _randomise(model: torch.nn.Module, seed: int) -> None:
    """Every parameter random: gains near 1, the rest normal(0, 0.08)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.1 * noise if name.endswith("norm.weight") else 0.08 * noise)


def save_checkpoint(config: object, path: Path, seed: int = 0, **save: object) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomise(model, seed)
    model.save_pretrained(path, **save)
    return model.eval()


def _ids(vocab: int, length: int, rows: int = 2) -> torch.Tensor:
    return torch.randint(0, vocab, (rows, length), generator=torch.Generator().manual_seed(1))


def _cached_logits(model: PolicyModel, ids: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits of every position through the cache: one prefill of `prefill` tokens, then decode."""
    rows, length = ids.shape
    cache = KVCache.empty(model.config, rows, length, model.dtype)
    start = torch.zeros(rows, dtype=torch.long)
    out = [model.forward_cached(ids[:, :prefill], start, cache)]
    for position in range(prefill, length):
        out.append(model.forward_cached(ids[:, position : position + 1], start + position, cache))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits_match_transformers_in_fp32(name: str, tmp_path: Path) -> None:
    theirs = save_checkpoint(CASES[name](), tmp_path)
    ours = load_model(tmp_path)
    ids = _ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        expected = theirs(ids).logits
        full = ours(ids)
        cached = _cached_logits(ours, ids, prefill=20)
    assert expected.abs().max() > 1.0  # random enough that a wrong path cannot hide in tiny logits
    assert (full - expected).abs().max() <= FP32_BOUND
    assert (cached - expected).abs().max() <= FP32_BOUND


@pytest.mark.parametrize("name", ["llama-tied-llama3-rope", "qwen3-head-dim-qk-norm"])
def test_logits_match_transformers_in_bf16(name: str, tmp_path: Path) -> None:
    save_checkpoint(CASES[name](), tmp_path)
    from transformers import AutoModelForCausalLM

    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
    ours = load_model(tmp_path, dtype=torch.bfloat16)
    ids = _ids(ours.config.vocab_size, 48)
    with torch.no_grad():
        expected = theirs(ids).logits.float()
        full = ours(ids).float()
        cached = _cached_logits(ours, ids, prefill=20).float()
    assert (full - expected).abs().max() <= BF16_BOUND
    assert (cached - expected).abs().max() <= BF16_BOUND


def test_sharded_checkpoint_with_published_rope_fields(tmp_path: Path) -> None:
    """Shards named by model.safetensors.index.json, and rope as top-level rope_theta/rope_scaling
    (how published Llama 3 checkpoints write it) load to the same model."""
    theirs = save_checkpoint(CASES["llama-tied-llama3-rope"](), tmp_path, max_shard_size="20KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    raw = json.loads((tmp_path / "config.json").read_text())
    rope = raw.pop("rope_parameters")
    raw["rope_theta"] = rope.pop("rope_theta")
    raw["rope_scaling"] = rope
    (tmp_path / "config.json").write_text(json.dumps(raw))
    ours = load_model(tmp_path)
    assert ours.config.rope_scaling is not None and ours.config.rope_scaling.kind == "llama3"
    ids = _ids(ours.config.vocab_size, 40)
    with torch.no_grad():
        assert (ours(ids) - theirs(ids).logits).abs().max() <= FP32_BOUND


def test_config_fields_of_each_family(tmp_path: Path) -> None:
    save_checkpoint(CASES["qwen3-head-dim-qk-norm"](), tmp_path / "q3")
    save_checkpoint(CASES["qwen2-qkv-bias-tied"](), tmp_path / "q2")
    q3, q2 = read_config(tmp_path / "q3").model, read_config(tmp_path / "q2").model
    assert (q3.architecture, q3.head_dim, q3.qk_norm, q3.num_kv_heads) == ("Qwen3ForCausalLM", 24, True, 1)
    assert (q2.qkv_bias, q2.o_bias, q2.tie_word_embeddings) == (True, False, True)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        ({"architectures": ["MistralForCausalLM"]}, "architectures"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}}, "rope_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"dtype": "float8"}, "dtype"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(edit: dict, field: str, tmp_path: Path) -> None:
    save_checkpoint(CASES["llama-gqa"](), tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**raw, **edit}))
    with pytest.raises(ModelDirError, match=field):
        load_model(tmp_path)


def test_a_missing_shard_is_named(tmp_path: Path) -> None:
    save_checkpoint(CASES["llama-gqa"](), tmp_path, max_shard_size="20KB")
    shard = sorted(tmp_path.glob("model-*.safetensors"))[-1]
    shard.unlink()
    with pytest.raises(ModelDirError, match=shard.name):
        load_model(tmp_path)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_published_version_keeps_the_layout_it_came_in(dtype: str, tmp_path: Path) -> None:
    """Tied stays tied, the architecture and the stored dtype stay, side files are copied, and the
    version loads in transformers with the new weights."""
    from transformers import AutoModelForCausalLM

    from trainer.checkpoint import save_version

    base = tmp_path / "base"
    save_checkpoint(CASES["qwen2-qkv-bias-tied"](), base)
    raw = json.loads((base / "config.json").read_text())
    (base / "config.json").write_text(json.dumps({**raw, "dtype": dtype}))
    (base / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    model = load_model(base)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(1.5)  # the tied output layer moves with it
    out = save_version(model, base, tmp_path / "v1", weight_version=1)
    info = read_config(out)
    assert (info.model, info.dtype, info.weight_version) == (read_config(base).model, dtype, 1)
    assert (out / "tokenizer_config.json").read_text() == (base / "tokenizer_config.json").read_text()
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        assert "lm_head.weight" not in names
        assert handle.get_tensor("model.embed_tokens.weight").dtype == getattr(torch, dtype)
    theirs = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = _ids(model.config.vocab_size, 16)
    with torch.no_grad():
        bound = FP32_BOUND if dtype == "float32" else BF16_BOUND
        assert (theirs(ids).logits - model(ids)).abs().max() <= bound
    assert torch.equal(theirs.lm_head.weight, theirs.model.embed_tokens.weight)
