"""Workspace copies: everything owned by the sandbox uid, modes, links and mtimes kept, source untouched."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandboxes.workspace import WorkspaceError, count_entries, fill_workspace, remove_stale_workspaces

UID = 231_000


def test_fill_copies_files_dirs_and_links_owned_by_the_sandbox_uid(repo: Path, tmp_path: Path) -> None:
    script = repo / "run.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o755)
    os.utime(script, ns=(1_000_000_000, 1_000_000_000))
    (repo / "link").symlink_to("pkg/core.py")
    dest = tmp_path / "ws"
    copied = fill_workspace(repo, dest, UID, UID)
    assert copied == count_entries(repo, 1000) == 6  # pkg, 2 modules, README, run.sh, link
    assert (dest / "pkg" / "core.py").read_text() == (repo / "pkg" / "core.py").read_text()
    assert (dest / "run.sh").stat().st_mode & 0o777 == 0o755
    assert (dest / "run.sh").stat().st_mtime_ns == 1_000_000_000
    assert os.readlink(dest / "link") == "pkg/core.py"
    owners = {path.lstat().st_uid for path in [dest, *dest.rglob("*")]}
    assert owners == {UID}
    assert {path.lstat().st_uid for path in repo.rglob("*")} == {os.getuid()}


def test_counting_stops_early(repo: Path) -> None:
    assert count_entries(repo, 2) == 2


def test_a_missing_source_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="not a directory"):
        fill_workspace(tmp_path / "nope", tmp_path / "ws", UID, UID)


def test_stale_workspaces_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead, alive = tmp_path / "999999999-bwrap-x", tmp_path / f"{os.getpid()}-bwrap-y"
    for path in (dead, alive, tmp_path / ".uids"):
        path.mkdir()
    remove_stale_workspaces(tmp_path)
    assert not dead.exists() and alive.exists() and (tmp_path / ".uids").exists()
