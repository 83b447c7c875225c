"""A `model.safetensors` laid out straight from the weights into a reused buffer, written with O_DIRECT.

`lay_out(buffer, tensors, dtype)` writes the safetensors file of HF-named tensors (header,
then each tensor converted to `dtype` in place, names in order) into any writable buffer;
`file_size` says how large it will be. Every `model.safetensors` we write goes through it,
so a version made by the RL loop and one made by `save_version` are the same bytes.

`WeightsStage.stage(...)` does that into one page-aligned buffer that a trainer keeps for
its whole life and returns a view of it: valid until the next `stage()`, which is why the
RL loop drains the previous publish before staging the next version
(`trainer.background_publish`). `write_direct(path, data)` writes such a view with
O_DIRECT where the filesystem allows it (a plain write elsewhere, e.g. tmpfs).

Why not a fresh `bytes` and a plain write: a version of SmolLM2 is 538 MB. On the VMs we
run on, memory the kernel frees is handed back to the host at once (free page reporting),
so every page touched for the first time costs a host fault: a new copy of the weights, a
new bytes object and new page cache for the file cost ~5 s of system CPU each per
version, beside a 9 s step on 2 cores. A buffer kept for the trainer's life keeps its
pages, and O_DIRECT writes need no page cache (0.27 s vs 5.5 s for 512 MB, measured
2026-12-06); on any machine they also keep a trainer from evicting what its engines read.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_ALIGN = 4096  # O_DIRECT: buffer address, file offset and length in whole logical blocks
_CHUNK = 64 << 20


def _header(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, metadata: dict[str, str]) -> bytes:
    """The JSON header (names in order, offsets back to back), padded to 8 bytes as safetensors does."""
    if dtype not in SAFETENSORS_DTYPES:
        raise ValueError(f"cannot write {dtype} weights; one of {sorted(map(str, SAFETENSORS_DTYPES))}")
    entries: dict[str, object] = {"__metadata__": metadata}
    offset, size = 0, torch.empty((), dtype=dtype).element_size()
    for name in sorted(tensors):
        shape = list(tensors[name].shape)
        end = offset + size * int(np.prod(shape, dtype=np.int64))
        entries[name] = {"dtype": SAFETENSORS_DTYPES[dtype], "shape": shape, "data_offsets": [offset, end]}
        offset = end
    text = json.dumps(entries, separators=(",", ":")).encode()
    return text + b" " * (-len(text) % 8)


def file_size(tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, metadata: dict[str, str]) -> int:
    header = _header(tensors, dtype, metadata)
    size = torch.empty((), dtype=dtype).element_size()
    return 8 + len(header) + sum(size * t.numel() for t in tensors.values())


def lay_out(
    buffer: memoryview, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, metadata: dict[str, str]
) -> int:
    """Write the safetensors file of `tensors` in `dtype` at the start of `buffer`; returns its length.
    Each tensor is converted straight into its place: no copy of the weights is made on the way."""
    header = _header(tensors, dtype, metadata)
    buffer[:8] = len(header).to_bytes(8, "little")
    buffer[8 : 8 + len(header)] = header
    offset = 8 + len(header)
    for name in sorted(tensors):
        source = tensors[name].detach()
        nbytes = source.numel() * torch.empty((), dtype=dtype).element_size()
        if nbytes:
            target = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset)
            target.view(dtype).view(source.shape).copy_(source)
        offset += nbytes
    return offset


class WeightsStage:
    """One page-aligned buffer, grown when a larger file comes, that each version is laid out in."""

    def __init__(self) -> None:
        self._buffer: mmap.mmap | None = None

    def stage(
        self, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, metadata: dict[str, str]
    ) -> memoryview:
        """The file's bytes, a view of the stage's buffer: valid until the next `stage()`."""
        size = file_size(tensors, dtype, metadata)
        if self._buffer is None or len(self._buffer) < size:
            # a new buffer rather than a resize: a view of the old one may still be held
            self._buffer = mmap.mmap(-1, size + (-size % _ALIGN))
        view = memoryview(self._buffer)
        return view[: lay_out(view, tensors, dtype, metadata)]


def _aligned(data: memoryview) -> bool:
    return np.frombuffer(data, dtype=np.uint8).ctypes.data % _ALIGN == 0 if len(data) else False


def write_direct(path: Path, data: bytes | bytearray | memoryview) -> None:
    """Write `data` as the file `path`: its whole blocks with O_DIRECT when the buffer is aligned and
    the filesystem takes it, the rest (and everything elsewhere) with a plain write."""
    view = memoryview(data).cast("B")
    written = 0
    if _aligned(view) and hasattr(os, "O_DIRECT"):
        written = _write_whole_blocks(path, view[: len(view) - len(view) % _ALIGN])
    with open(path, "r+b" if written else "wb") as handle:
        handle.seek(written)
        handle.write(view[written:])
        handle.truncate()


def _write_whole_blocks(path: Path, view: memoryview) -> int:
    """How much of `view` went out with O_DIRECT (0 where the filesystem refuses it)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    except OSError:  # EINVAL: no O_DIRECT here (tmpfs, some network filesystems)
        return 0
    written = 0
    try:
        while written < len(view):
            written += os.write(fd, view[written : written + _CHUNK])
    except OSError:
        written -= written % _ALIGN  # what is on disk stays; the plain write does the rest
    finally:
        os.close(fd)
    return written
