"""LoRA and bf16 training through `TorchBackend`: merged versions, bit-exact resume, what trains."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.backends import TorchBackend
from trainer.model import build_model
from trainer.resume import Checkpoint, CheckpointError, restore_backend
from trainer.settings import LoraSettings, TrainerSettings

from .test_step import CONFIG, batch_of_samples

LORA = LoraSettings(rank=4, alpha=8.0, target_modules=("q_proj", "v_proj", "gate_proj", "down_proj"))


def backend(settings: TrainerSettings, seed: int = 3) -> TorchBackend:
    return TorchBackend(build_model(CONFIG, seed=seed), settings, lr=settings.lr)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_lora_trains_only_the_adapters_and_publishes_merged_weights(dtype: str) -> None:
    settings = TrainerSettings(lr=1e-2, lora=LORA, dtype=dtype)
    trainer = backend(settings)
    base = build_model(CONFIG, seed=3).state_dict()
    for _ in range(3):
        metrics = trainer.rl_step(batch_of_samples())
    assert metrics.grad_norm > 0
    published = trainer.hf_state_dict()
    assert set(published) == set(base)  # HF names only: no base_layer, no lora_ tensors
    changed = {name for name in base if not torch.equal(published[name], base[name])}
    assert changed == {
        f"model.layers.{i}.{m}.weight"
        for i in range(2)
        for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.down_proj")
    }
    merged = build_model(CONFIG, seed=0)
    merged.load_state_dict(published)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        assert torch.allclose(merged(ids), trainer.model.eval()(ids), atol=1e-5)


@pytest.mark.parametrize("lora", [LORA, LoraSettings()], ids=["lora", "full"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resume_from_a_checkpoint_is_bit_exact(lora: LoraSettings, dtype: str, tmp_path: Path) -> None:
    settings = TrainerSettings(lr=1e-2, lora=lora, dtype=dtype)
    straight = backend(settings)
    for _ in range(3):
        straight.rl_step(batch_of_samples())
    first = backend(settings)
    first.rl_step(batch_of_samples())
    rng = first.save_state(tmp_path / "state")
    saved = {key for key in _checkpoint_keys(tmp_path / "state") if key.startswith("model.")}
    if lora.rank:
        assert saved and all(".lora_" in key for key in saved)  # adapters only: the base is on disk
    else:
        assert saved == {f"model.{name}" for name in build_model(CONFIG).state_dict()}
    first.rl_step(batch_of_samples())  # moves on: the resumed run must not see this
    resumed = backend(settings)
    resumed.load_state(tmp_path / "state", rng)
    for _ in range(2):
        resumed.rl_step(batch_of_samples())
    for name, tensor in straight.hf_state_dict().items():
        assert torch.equal(tensor, resumed.hf_state_dict()[name]), name


def _checkpoint_keys(directory: Path) -> set[str]:
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(directory)).read_metadata().state_dict_metadata)


def test_a_checkpoint_of_another_lora_setting_is_refused(tmp_path: Path) -> None:
    full = backend(TrainerSettings(lr=1e-2))
    rng = full.save_state(tmp_path / "checkpoint.pt.state-000001")
    checkpoint = Checkpoint(
        run_id="r",
        mode="rl",
        version=1,
        step=1,
        model_shape={},
        state="checkpoint.pt.state-000001",
        state_kind=full.state_kind,
        rng=rng,
    )
    lora = backend(TrainerSettings(lr=1e-2, lora=LORA))
    with pytest.raises(CheckpointError, match="'torch' backend, this trainer's is 'torch-lora rank 4 on "):
        restore_backend(checkpoint, tmp_path / "checkpoint.pt", lora, 1)


def test_bf16_steps_follow_fp32_steps() -> None:
    """Autocast changes the arithmetic, not the update: a bf16 step moves the weights the way an fp32
    step does (Adam's first step is +-lr per weight, so compare directions, not sizes)."""
    start = build_model(CONFIG, seed=3).state_dict()["lm_head.weight"]
    results = {}
    for dtype in ("float32", "bfloat16"):
        trainer = backend(TrainerSettings(lr=1e-3, dtype=dtype))
        metrics = trainer.rl_step(batch_of_samples())
        results[dtype] = (metrics.loss, trainer.hf_state_dict()["lm_head.weight"] - start)
    (loss32, step32), (loss16, step16) = results["float32"], results["bfloat16"]
    assert abs(loss32 - loss16) < 0.05 * max(abs(loss32), 1e-3)
    cosine = torch.nn.functional.cosine_similarity(step32.flatten(), step16.flatten(), dim=0)
    assert 0.9 < cosine < 1.0


def test_prune_keeps_the_newest_versions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from trainer.publish import prune_versions, run_weights_dir
    from trainer.versions import version_dir

    for version in range(1, 7):
        version_dir(tmp_path, "r", version).mkdir(parents=True)
    (run_weights_dir(tmp_path, "r") / "checkpoint.pt").write_text("kept")
    removed = prune_versions(tmp_path, "r", keep=2)
    assert [p.name for p in removed] == [f"{v:06d}" for v in range(1, 5)]
    left = sorted(p.name for p in run_weights_dir(tmp_path, "r").iterdir())
    assert left == ["000005", "000006", "checkpoint.pt"]
