"""Bubblewrap sandbox lifecycle: copy-on-write workspaces, file transfer, and infrastructure errors."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from sandboxes.backends import make_factory
from sandboxes.base import BackendUnavailableError, SandboxLostError, SandboxStartError, SandboxTimeoutError
from sandboxes.bwrap import BwrapSandbox, BwrapSandboxFactory
from sandboxes.settings import BwrapSettings, SandboxSettings
from tests.sandboxes.conftest import exec_server_pid

pytestmark = pytest.mark.timeout(120)


async def test_workspaces_are_private_copies(factory: BwrapSandboxFactory, repo: Path) -> None:
    first, second = factory.create(repo), factory.create(repo)
    await first.start()
    await second.start()
    try:
        edit = await first.exec("echo 'VALUE = 2' > pkg/__init__.py && echo new > added.txt && rm README.md")
        assert edit.exit_code == 0, edit
        seen = await second.exec("cat pkg/__init__.py; ls")
        assert seen.stdout == "VALUE = 1\nREADME.md\npkg\n"
        assert (await first.exec("cat pkg/__init__.py added.txt")).stdout == "VALUE = 2\nnew\n"
    finally:
        await first.stop()
        await second.stop()
    assert (repo / "pkg" / "__init__.py").read_text() == "VALUE = 1\n"
    assert (repo / "README.md").exists() and not (repo / "added.txt").exists()
    assert not first.workspace_dir.exists(), "stop() removes the workspace copy"


async def test_upload_and_download_inside_and_outside_the_workspace(
    box: BwrapSandbox, tmp_path: Path
) -> None:
    local = tmp_path / "tests"
    local.mkdir()
    (local / "test_x.py").write_text("def test_x():\n    assert True\n")
    (tmp_path / "solve.sh").write_text("echo solved > /workspace/solved.txt\n")
    await box.upload(local, "/workspace/tests")
    await box.upload(tmp_path / "solve.sh", "/tmp/solve.sh")
    result = await box.exec(
        "bash /tmp/solve.sh && cat tests/test_x.py | head -1"
        " && mkdir -p /tmp/logs && echo 1 > /tmp/logs/reward.txt"
    )
    assert result.exit_code == 0, result
    assert result.stdout == "def test_x():\n"
    await box.download("/tmp/logs", tmp_path / "logs")
    await box.download("solved.txt", tmp_path / "solved.txt")
    assert (tmp_path / "logs" / "reward.txt").read_text() == "1\n"
    assert (tmp_path / "solved.txt").read_text() == "solved\n"


async def test_python_with_pytest_is_available(box: BwrapSandbox) -> None:
    result = await box.exec("python -m pytest --version", timeout=60)
    assert result.exit_code == 0, result
    assert "pytest" in result.stdout + result.stderr


async def test_a_killed_sandbox_is_lost_not_a_failing_command(box: BwrapSandbox) -> None:
    assert box._process is not None
    box._process.send_signal(signal.SIGKILL)
    await box._process.wait()
    with pytest.raises(SandboxLostError):
        await box.exec("echo hi")


async def test_a_frozen_sandbox_is_a_timeout_not_a_failing_command(
    factory: BwrapSandboxFactory, settings: SandboxSettings
) -> None:
    quick = settings.model_copy(update={"bwrap": settings.bwrap.model_copy(update={"server_grace_s": 1.0})})
    box = BwrapSandboxFactory(quick).create(None)
    await box.start()
    try:
        assert box._process is not None
        server = exec_server_pid(box._process.pid)
        os.kill(server, signal.SIGSTOP)
        with pytest.raises(SandboxTimeoutError):
            await box.exec("echo hi", timeout=1)
    finally:
        await box.stop()


async def test_a_sandbox_that_cannot_start_is_a_start_error(settings: SandboxSettings) -> None:
    broken = settings.model_copy(
        update={"bwrap": settings.bwrap.model_copy(update={"ro_paths": ("/no/such/path",)})}
    )
    box = BwrapSandboxFactory(broken).create(None)
    with pytest.raises(SandboxStartError, match="no/such/path"):
        await box.start()


def test_missing_bubblewrap_is_reported_clearly() -> None:
    with pytest.raises(BackendUnavailableError, match="bubblewrap"):
        make_factory(SandboxSettings(bwrap=BwrapSettings(bwrap_path="/no/bwrap")))


async def test_downloading_a_missing_file_is_a_caller_error(box: BwrapSandbox, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        await box.download("/tmp/logs/reward.txt", tmp_path / "reward.txt")
    with pytest.raises(FileNotFoundError):
        await box.download("missing.txt", tmp_path / "missing.txt")
    assert (await box.exec("echo still fine")).stdout == "still fine\n"


async def test_an_exec_abandoned_by_its_caller_does_not_answer_the_next_one(box: BwrapSandbox) -> None:
    abandoned = asyncio.create_task(box.exec("sleep 1; echo first"))
    await asyncio.sleep(0.3)
    abandoned.cancel()
    with pytest.raises(asyncio.CancelledError):
        await abandoned
    result = await box.exec("echo second", timeout=30)
    assert result.stdout == "second\n", result
    assert (await box.exec("echo third")).stdout == "third\n"
