"""The docker backend's exec helper in the default image and in one without Python, libc or
coreutils (busybox alone), through podman's real API: the same results, timeouts, output
caps, files in and out; and the engine-exec channel (`sandbox.docker.channel = "engine"`)
holding the same contract."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from sandboxes.docker import DockerSandbox, DockerSandboxFactory

pytestmark = pytest.mark.timeout(300)
PROCESS_LIST = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


@pytest.fixture(params=["default", "busybox", "engine"])
async def any_box(
    request: pytest.FixtureRequest,
    make_factory: Callable[..., DockerSandboxFactory],
    no_python_image: str,
    tmp_path: Path,
) -> AsyncIterator[DockerSandbox]:
    """A sandbox over a small workspace: default image, busybox image, or default image over engine execs."""
    docker: dict[str, object] = {}
    if request.param == "busybox":
        docker["image"] = no_python_image
    if request.param == "engine":
        docker["channel"] = "engine"
    workspace = tmp_path / "repo"
    (workspace / "pkg").mkdir(parents=True)
    (workspace / "pkg" / "data.txt").write_text("42\n")
    box = make_factory(docker=docker, limits={"output_limit_bytes": 4000}).create(workspace)
    await box.start()
    yield box
    await box.stop()


async def test_results_streams_env_and_cwd(any_box: DockerSandbox) -> None:
    result = await any_box.exec(
        "cat pkg/data.txt; echo oops >&2; pwd; echo $GREETING; exit 4", env={"GREETING": "hi there"}
    )
    assert (result.exit_code, result.stdout, result.stderr) == (4, "42\n/workspace\nhi there\n", "oops\n")
    assert (await any_box.exec("pwd", cwd="pkg")).stdout == "/workspace/pkg\n"
    assert (await any_box.exec("no-such-command")).exit_code == 127


async def test_timeout_ends_every_process_and_the_sandbox_goes_on(any_box: DockerSandbox) -> None:
    result = await any_box.exec("sleep 996 & setsid sleep 997 & echo started; sleep 999", timeout=2)
    assert result.timed_out and result.killed_reason == "timeout" and result.stdout == "started\n"
    assert "sleep 99" not in (await any_box.exec(PROCESS_LIST)).stdout
    assert (await any_box.exec("echo still here")).stdout == "still here\n"


async def test_output_beyond_the_limit_keeps_head_and_tail(any_box: DockerSandbox) -> None:
    result = await any_box.exec("echo START; head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END")
    assert result.exit_code == 0 and result.output_truncated
    assert result.output_bytes == len("START\n") + 3_000_000 + len("\nEND\n")
    assert (
        result.stdout.startswith("START\nx")
        and result.stdout.endswith("x\nEND\n")
        and len(result.stdout) < 4000
    )


async def test_files_in_and_out(any_box: DockerSandbox, tmp_path: Path) -> None:
    source = tmp_path / "tests"
    source.mkdir()
    (source / "test_a.sh").write_text("echo a\n")
    await any_box.upload(source, "/tests")
    await any_box.upload(source / "test_a.sh", "copy/one.sh")
    assert (await any_box.exec("sh /tests/test_a.sh; sh copy/one.sh")).stdout == "a\na\n"
    await any_box.exec("mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
    await any_box.download("/logs/verifier", tmp_path / "verifier")
    assert (tmp_path / "verifier" / "reward.txt").read_text() == "1\n"
    with pytest.raises(FileNotFoundError):
        await any_box.download("/logs/none", tmp_path / "none")


async def test_the_busybox_image_has_no_python_and_the_helper_needs_none(
    make_factory: Callable[..., DockerSandboxFactory], no_python_image: str
) -> None:
    box = make_factory(docker={"image": no_python_image}).create(None)
    await box.start()
    try:
        probe = await box.exec("command -v python3 python; ls /usr/bin /lib 2>&1; cat /proc/1/comm")
    finally:
        await box.stop()
    assert "python" not in probe.stdout.replace("rollstream", "")
    assert probe.stdout.rstrip().endswith("exec")  # PID 1 is the helper, bind-mounted in
