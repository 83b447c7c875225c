"""The megatron conversion on the real SmolLM2-135M-Instruct weights (Llama, 30 layers, tied
embeddings, GQA 9/3, head_dim 64): HF → megatron → HF gives back every stored tensor exactly,
and megatron's computation on the converted weights (tests/trainer/megatron_reference.py)
gives `PolicyModel`'s logits.

The directory is what `rollstream model get smollm2-135m-instruct` converts under
`<state_dir>/models/`; these tests never fetch it (tests/trainer/test_smollm2.py does, and runs
first in a whole-suite run) and are skipped, saying how to get it, when it is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollstream.config import Config
from tests.trainer.megatron_reference import reference_logits
from trainer.checkpoint import load_model, read_config, read_weights
from trainer.megatron_convert import hf_to_megatron, megatron_shapes, megatron_to_hf
from trainer.model_sources import fetched_model, models_dir

pytestmark = pytest.mark.slow

NAME = "smollm2-135m-instruct"
# fp32, logits up to ~34. Measured 0 here (the same torch kernels in the same order); megatron-core
# 0.16.1 itself on CPU is 8.6e-5 from PolicyModel (scripts/megatron_cpu_parity.py).
LOGIT_BOUND = 2e-4


@pytest.fixture(scope="module")
def smollm2(base_config: Config) -> Path:
    path = fetched_model(NAME, models_dir(base_config.state_dir))
    if path is None:
        pytest.skip(
            f"{NAME} is not under {models_dir(base_config.state_dir)}: run `rollstream model get {NAME}` "
            "(or tests/trainer/test_smollm2.py, which fetches it) first"
        )
    return path


def test_round_trip_gives_back_every_stored_tensor(smollm2: Path) -> None:
    config = read_config(smollm2).model
    assert config.tie_word_embeddings and (config.num_heads, config.num_kv_heads, config.head_dim) == (
        9,
        3,
        64,
    )
    stored = read_weights(smollm2)
    assert "lm_head.weight" not in stored  # tied: the checkpoint keeps the embedding only
    megatron = hf_to_megatron(stored, config)
    assert {k: tuple(t.shape) for k, t in megatron.items()} == megatron_shapes(config)
    assert "output_layer.weight" not in megatron
    assert megatron["decoder.layers.29.self_attention.linear_qkv.weight"].shape == ((9 + 2 * 3) * 64, 576)
    back = megatron_to_hf(megatron, config)
    assert back.keys() == stored.keys() | {"lm_head.weight"}
    for name, tensor in stored.items():
        assert torch.equal(back[name], tensor), name
    assert back["lm_head.weight"] is back["model.embed_tokens.weight"]


def test_megatron_computation_on_converted_weights_gives_policy_model_logits(smollm2: Path) -> None:
    model = load_model(smollm2)
    ids = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids)
        theirs = reference_logits(hf_to_megatron(model.state_dict(), model.config), model.config, ids)
    gap = float((theirs - ours).abs().max())
    assert gap <= LOGIT_BOUND, f"max |logit difference| {gap:.2e}"
