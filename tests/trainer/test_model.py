"""The policy model: HF parity, save/load, the cached forward equals the full forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.checkpoint import init_model_dir, load_model, read_config, save_model, weight_version
from trainer.model import KVCache, ModelConfig, build_model
from trainer.settings import ModelSettings


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(ModelSettings(), tmp_path_factory.mktemp("model") / "m")


def test_directory_has_the_hf_layout(model_dir: Path) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= names
    assert read_config(model_dir).model == ModelConfig.from_settings(ModelSettings())
    assert weight_version(model_dir) == 0


def test_transformers_llama_gives_the_same_logits(model_dir: Path) -> None:
    from transformers import LlamaForCausalLM

    ours = load_model(model_dir)
    theirs = LlamaForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    ids = torch.randint(0, ours.config.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours_logits, their_logits = ours(ids), theirs(ids).logits
    assert their_logits.shape == ours_logits.shape
    assert torch.allclose(ours_logits, their_logits, atol=1e-5, rtol=0)


def test_transformers_tokenizer_and_chat_template_agree(model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from trainer.tokenizer import load_tokenizer

    theirs = AutoTokenizer.from_pretrained(model_dir)
    text = "def f(x):\n    return x  # ok <|im_end|>"
    assert theirs.encode(text) == load_tokenizer(model_dir).encode(text).ids
    messages = [{"role": "user", "content": "hi"}]
    chat = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert theirs.eos_token_id == 2 and theirs.pad_token_id == 0


def test_save_and_load_round_trip_with_weight_version(model_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    other = build_model(load_model(model_dir).config, seed=5)
    save_model(other, copy, weight_version=3)
    loaded = load_model(copy)
    assert weight_version(copy) == 3
    for (name, a), (_, b) in zip(other.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(loaded.lm_head.weight, load_model(model_dir).lm_head.weight)


def test_save_version_makes_a_complete_directory(model_dir: Path, tmp_path: Path) -> None:
    from trainer.checkpoint import save_version
    from trainer.tokenizer import load_tokenizer

    model = build_model(load_model(model_dir).config, seed=8)
    out = save_version(model, model_dir, tmp_path / "v4", weight_version=4)
    assert weight_version(out) == 4 and read_config(out).specials == read_config(model_dir).specials
    assert load_tokenizer(out).to_str() == load_tokenizer(model_dir).to_str()
    assert torch.equal(load_model(out).lm_head.weight, model.lm_head.weight)


def test_init_refuses_to_overwrite(model_dir: Path) -> None:
    with pytest.raises(FileExistsError, match="already holds a model"):
        init_model_dir(ModelSettings(), model_dir)


def test_cached_ragged_forward_equals_full_forward() -> None:
    config = ModelConfig(
        vocab_size=300,
        hidden_size=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        max_position=512,
    )
    model = build_model(config, seed=1)
    ids = torch.randint(0, 300, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache.empty(config, 3, 32, torch.float32)
        lengths = [10, 14, 7]  # ragged prefill, one row at a time, then batched decode
        for row, length in enumerate(lengths):
            got = model.forward_cached(ids[row : row + 1, :length], torch.tensor([0]), cache.row(row))
            assert torch.allclose(got[0], full[row, :length], atol=1e-5)
        for step in range(6):
            start = torch.tensor(lengths) + step
            tokens = ids[torch.arange(3), start][:, None]
            got = model.forward_cached(tokens, start, cache)[:, 0]
            assert torch.allclose(got, full[torch.arange(3), start], atol=1e-5)


@pytest.mark.parametrize(("hidden", "layers", "low", "high"), [(64, 2, 0.3e6, 1.5e6), (512, 8, 25e6, 100e6)])
def test_sizes_follow_the_config(hidden: int, layers: int, low: float, high: float) -> None:
    settings = ModelSettings(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=8,
        num_kv_heads=4,
        intermediate_size=hidden * 8 // 3,
        vocab_size=4096,
    )
    with torch.device("meta"):
        from trainer.model import PolicyModel

        size = PolicyModel(ModelConfig.from_settings(settings)).num_parameters()
    assert low <= size <= high


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        ModelConfig(
            vocab_size=300,
            hidden_size=64,
            num_layers=1,
            num_heads=4,
            num_kv_heads=3,
            intermediate_size=128,
            max_position=64,
        )
