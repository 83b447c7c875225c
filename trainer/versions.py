"""Weight versions on disk: where a version lives and its checksum.

A version is a complete Hugging Face model directory under
`<weights_dir>/<run>/<version>/`, written into a temp directory beside it and
renamed into place, so a reader sees a whole version or none. Its checksum is
`directory_sha256`: sha256 over each file's relative path and sha256, in path
order, so trainers and engines (which verify before loading) compute the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

TEMP_PREFIX = ".tmp-"
_CHUNK = 1 << 20


def version_dir(weights_dir: Path, run_id: str, version: int) -> Path:
    return Path(weights_dir) / run_id / f"{version:06d}"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def directory_sha256(path: Path, known: Mapping[str, str] | None = None) -> str:
    """The checksum of a model directory (files only, temp files excluded). `known`: the sha256 of
    files by relative path, where the writer hashed the bytes it wrote (not read back)."""
    known = known or {}
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    digest = hashlib.sha256()
    for file in sorted(p for p in root.rglob("*") if p.is_file() and not p.name.endswith(".tmp")):
        relative = file.relative_to(root).as_posix()
        digest.update(f"{relative}\0{known.get(relative) or file_sha256(file)}\n".encode())
    return digest.hexdigest()


class ChecksumMismatch(ValueError):
    """A weight directory whose contents are not what its `weights` event announced."""


def verify_directory(path: Path, expected: str) -> None:
    """Raise `ChecksumMismatch` unless `path` hashes to `expected` (empty = not checked)."""
    if not expected:
        return
    actual = directory_sha256(path)
    if actual != expected:
        raise ChecksumMismatch(
            f"{path}: sha256 {actual[:12]}… does not match the published {expected[:12]}…; "
            "the directory was changed or is incomplete: republish the version or point at the right path"
        )
