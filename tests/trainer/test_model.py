"""The policy model: HF parity, save/load, the cached forward equals the full forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.checkpoint import init_model_dir, load_model, read_config, save_model, weight_version
from trainer.model import ModelConfig, build_model
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
    assert weight_version(out) == 4
    base, new = read_config(model_dir).raw, read_config(out).raw
    assert {k: v for k, v in new.items() if k != "rollstream"} == {
        k: v for k, v in base.items() if k != "rollstream"
    }
    assert load_tokenizer(out).to_str() == load_tokenizer(model_dir).to_str()
    for name in ("tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_text() == (model_dir / name).read_text()
