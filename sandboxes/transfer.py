"""Tar archives for moving files in and out of sandboxes (docker's archive endpoints,
a tarball through E2B's file API, bwrap's exec server for paths outside the workspace).

`tar_directory` packs a workspace under the container's workdir; `tar_path` packs a
file or directory under a path relative to `/` (the engine creates missing parent
directories); `extract_download` turns the engine's archive of one path (whose single
top-level entry is that path's basename) into `local`, refusing unsafe members.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path


def tar_directory(source: Path | None, workdir: str) -> bytes:
    """A tar holding `workdir` (absolute, inside the container) with the contents of `source`."""
    arcname = workdir.strip("/")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        if source is None:
            info = tarfile.TarInfo(arcname)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
        else:
            archive.add(source, arcname=arcname, recursive=True)
    return buffer.getvalue()


def tar_path(local: Path, arcname: str) -> bytes:
    """A tar holding `local` (file or directory) as `arcname`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(local, arcname=arcname, recursive=True)
    return buffer.getvalue()


def extract_download(archive_path: Path, local: Path, scratch: Path) -> None:
    """Extract the single top-level entry of `archive_path` to `local` (file or directory)."""
    scratch.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive_path, mode="r") as archive:
        names = archive.getnames()
        if not names:
            raise FileNotFoundError(f"the engine sent an empty archive for {local.name}")
        top = names[0].split("/")[0]
        archive.extractall(scratch, filter="data")
    extracted = scratch / top
    local.parent.mkdir(parents=True, exist_ok=True)
    if local.is_dir() and not local.is_symlink():
        shutil.rmtree(local)  # `local` is the destination itself: replaced, never merged into
    elif local.exists() or local.is_symlink():
        local.unlink()
    shutil.move(str(extracted), str(local))
