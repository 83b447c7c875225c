"""A version laid out in a reused buffer is safetensors' own file, and O_DIRECT writes keep every byte."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load, load_file, save

from trainer.versions import directory_sha256
from trainer.weights_stage import WeightsStage, write_direct

METADATA = {"format": "pt"}


def _tensors() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "model.embed_tokens.weight": torch.randn(1000, 33, generator=generator),
        "model.norm.weight": torch.randn(33, generator=generator),
        "lm_head.weight": torch.randn(1000, 33, generator=generator),
        "empty": torch.zeros(0),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_staged_file_is_the_bytes_safetensors_writes(dtype: torch.dtype) -> None:
    tensors = _tensors()
    staged = WeightsStage().stage(tensors, dtype, METADATA)
    expected = save({n: t.to(dtype).contiguous() for n, t in tensors.items()}, metadata=METADATA)
    assert bytes(staged) == expected  # so a version's checksum does not depend on the path that wrote it


def test_stage_keeps_its_buffer_and_grows_for_a_larger_file() -> None:
    stage, tensors = WeightsStage(), _tensors()
    first = stage.stage(tensors, torch.float32, METADATA)
    address = np.frombuffer(first, np.uint8).ctypes.data
    tensors["model.norm.weight"] += 1  # the next step's weights
    second = stage.stage(tensors, torch.float32, METADATA)
    assert np.frombuffer(second, np.uint8).ctypes.data == address  # no new memory for the next version
    assert load(bytes(second))["model.norm.weight"].equal(tensors["model.norm.weight"])
    tensors["bigger"] = torch.ones(5000)
    third = stage.stage(tensors, torch.float32, METADATA)
    assert load(bytes(third))["bigger"].equal(tensors["bigger"])


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_direct_write_keeps_every_byte(where: str, tmp_path: Path) -> None:
    root = tmp_path if where == "disk" else Path("/dev/shm")  # tmpfs refuses O_DIRECT: the plain path
    if not root.is_dir():
        pytest.skip("no /dev/shm here")
    staged = WeightsStage().stage(_tensors(), torch.float32, METADATA)
    assert len(staged) % 4096  # a tail past the last whole block
    path = root / f"weights-stage-{where}-{tmp_path.name}.safetensors"
    try:
        path.write_bytes(b"x" * (len(staged) + 10_000))  # a longer file there before: truncated
        write_direct(path, staged)
        assert path.read_bytes() == bytes(staged)
        assert load_file(path)["lm_head.weight"].equal(_tensors()["lm_head.weight"])
        write_direct(path, b"unaligned bytes")  # not from a stage: written plainly
        assert path.read_bytes() == b"unaligned bytes"
    finally:
        path.unlink(missing_ok=True)


def test_checksum_with_a_known_digest_is_the_checksum_read_back(tmp_path: Path) -> None:
    staged = WeightsStage().stage(_tensors(), torch.bfloat16, METADATA)
    write_direct(tmp_path / "model.safetensors", staged)
    (tmp_path / "config.json").write_text("{}")
    known = {"model.safetensors": hashlib.sha256(staged).hexdigest()}
    assert directory_sha256(tmp_path, known=known) == directory_sha256(tmp_path)
