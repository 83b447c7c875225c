"""Fixtures for the sandbox tests: real bubblewrap with small limits, and a sample repository."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from sandboxes.bwrap import BwrapSandbox, BwrapSandboxFactory
from sandboxes.settings import BwrapSettings, LimitSettings, PoolSettings, SandboxSettings


@pytest.fixture
def settings() -> SandboxSettings:
    """Small limits so the isolation tests are quick; generous start timeout for a loaded machine."""
    return SandboxSettings(
        backend="bwrap",
        limits=LimitSettings(
            command_timeout_s=60.0,
            cpu_time_s=60,
            memory_mb=512,
            max_processes=64,
            output_limit_bytes=64_000,
            tmpfs_mb=64,
        ),
        pool=PoolSettings(max_running=8, max_starting=4, warm_pool=0, start_timeout_s=60.0),
        bwrap=BwrapSettings(),
    )


@pytest.fixture
def factory(settings: SandboxSettings) -> BwrapSandboxFactory:
    return BwrapSandboxFactory(settings)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small task-like repository."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    (root / "pkg" / "core.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "README.md").write_text("sample\n")
    return root


@pytest.fixture
async def box(factory: BwrapSandboxFactory, repo: Path) -> AsyncIterator[BwrapSandbox]:
    sandbox = factory.create(repo)
    await sandbox.start()
    try:
        yield sandbox
    finally:
        await sandbox.stop()


def live_processes_of(uid: int) -> list[int]:
    """Host pids owned by `uid` that are not zombies."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != uid:
                continue
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(name))
    return found


def exec_server_pid(bwrap_pid: int) -> int:
    """The exec server: the python process below `bwrap_pid` (bwrap → bwrap init → server)."""
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    frontier = [bwrap_pid]
    while frontier:
        pid = frontier.pop()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"bwrap_server.py" in cmdline and not cmdline.startswith(b"bwrap"):
            return pid
        frontier.extend(children.get(pid, []))
    raise AssertionError("exec server not found")
