"""Isolation of the bubblewrap backend, each through a real sandbox.

Every hostile command must end as an `ExecResult` (a command failure), never an
infrastructure error, and must leave the host and the pool able to serve a
fresh sandbox.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import time
from pathlib import Path

import pytest

from sandboxes.bwrap import BwrapSandbox, BwrapSandboxFactory
from sandboxes.pool import SandboxPool
from sandboxes.settings import SandboxSettings
from tests.sandboxes.conftest import exec_server_pid, live_processes_of

pytestmark = pytest.mark.timeout(180)
KAFKA_BROKER = ("127.0.0.1", 19092)


async def assert_pool_still_serves(
    settings: SandboxSettings, factory: BwrapSandboxFactory, repo: Path
) -> None:
    async with SandboxPool(settings, factory) as pool, pool.sandbox(repo) as fresh:
        result = await fresh.exec("echo alive && cat pkg/__init__.py")
    assert result.exit_code == 0, result
    assert result.stdout == "alive\nVALUE = 1\n"


async def test_commands_run_as_an_unprivileged_uid_in_the_workspace(box: BwrapSandbox) -> None:
    result = await box.exec("id -u; pwd; ls")
    assert result.exit_code == 0, result
    uid, cwd, *files = result.stdout.split()
    assert int(uid) == box.uid and int(uid) != 0
    assert cwd == "/workspace"
    assert sorted(files) == ["README.md", "pkg"]


async def test_writing_outside_the_workspace_fails(box: BwrapSandbox, tmp_path: Path) -> None:
    marker = tmp_path / "escaped.txt"
    targets = ["/usr/escaped", "/etc/escaped", "/escaped", f"{marker}", "/run/rollstream/escaped"]
    script = "; ".join(f"(echo x > {target}) 2>/dev/null && echo WROTE {target}" for target in targets)
    result = await box.exec(f"{script}; echo x > /workspace/inside.txt && echo /tmp ok > /tmp/t && echo done")
    assert "WROTE" not in result.stdout, result
    assert result.stdout.strip().endswith("done")
    assert not marker.exists()
    assert not Path("/usr/escaped").exists() and not Path("/escaped").exists()
    assert (box.workspace_dir / "inside.txt").read_text() == "x\n"


async def test_no_network_not_even_the_local_kafka_broker(box: BwrapSandbox) -> None:
    listener = socket.create_server(("127.0.0.1", 0))  # reachable from the host, must not be from inside
    port = listener.getsockname()[1]
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
        probe = (
            "import socket\n"
            f"for address in [('127.0.0.1', {port}), {KAFKA_BROKER!r}, ('1.1.1.1', 53), ('10.0.0.1', 80)]:\n"
            "    try:\n"
            "        socket.create_connection(address, timeout=3).close()\n"
            "        print('CONNECTED', address)\n"
            "    except OSError as error:\n"
            "        print('refused', address, error.errno)\n"
        )
        result = await box.exec(f'python3 -c "{probe}"', timeout=60)
    finally:
        listener.close()
    assert result.exit_code == 0, result
    assert "CONNECTED" not in result.stdout
    assert result.stdout.count("refused") == 4


async def test_fork_bomb_is_contained(
    box: BwrapSandbox, settings: SandboxSettings, factory: BwrapSandboxFactory, repo: Path
) -> None:
    assert box.uid is not None
    bomb = "bomb() { bomb | bomb & }; bomb; sleep 3; echo survived"
    running = asyncio.create_task(box.exec(bomb, timeout=8))
    peak = 0
    while not running.done():
        peak = max(peak, len(live_processes_of(box.uid)))
        await asyncio.sleep(0.05)
    result = running.result()  # a result (the command's failure), not an infra error
    assert result.timed_out or result.exit_code is not None
    assert 2 <= peak <= settings.limits.max_processes, peak
    after = await box.exec("echo same box works", timeout=30)
    assert after.stdout == "same box works\n", after
    await assert_pool_still_serves(settings, factory, repo)


async def test_a_gigabyte_of_output_is_cut_without_filling_memory(box: BwrapSandbox) -> None:
    before_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = await box.exec("head -c 1000000000 /dev/zero | tr '\\0' 'x'; echo tail-marker", timeout=150)
    grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kb) / 1024
    assert result.exit_code == 0, result.stderr
    assert result.output_bytes == 1_000_000_000 + len("tail-marker\n")
    assert result.output_truncated
    assert len(result.stdout) <= 64_000 + 100
    assert result.stdout.startswith("xxxx") and result.stdout.endswith("tail-marker\n")
    assert "bytes omitted" in result.stdout
    assert grew_mb < 100, f"our RSS grew {grew_mb:.0f} MB"
    assert box._process is not None
    server_peak_kb = int(
        next(
            line.split()[1]
            for line in Path(f"/proc/{exec_server_pid(box._process.pid)}/status").read_text().splitlines()
            if line.startswith("VmHWM:")
        )
    )
    assert server_peak_kb < 100 * 1024, f"the exec server peaked at {server_peak_kb // 1024} MB"


async def test_a_memory_hog_is_stopped_and_classified(box: BwrapSandbox) -> None:
    hog = 'python3 -c "chunks = []\nwhile True: chunks.append(bytearray(50 * 1024 * 1024))"'
    result = await box.exec(hog, timeout=60)
    assert result.exit_code not in (0, None)
    assert not result.timed_out
    assert result.killed_reason == "memory", result
    assert (await box.exec("echo fine")).stdout == "fine\n"


async def test_timeout_kills_the_command_and_its_background_children(box: BwrapSandbox) -> None:
    command = "sleep 300 & setsid sleep 301 & (trap '' TERM; sleep 302) & echo started; sleep 303"
    began = time.monotonic()
    result = await box.exec(command, timeout=3)
    assert result.timed_out and result.killed_reason == "timeout", result
    assert result.stdout == "started\n"
    assert time.monotonic() - began < 60
    assert box.uid is not None
    deadline = time.monotonic() + 10
    while live_processes_of(box.uid) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert live_processes_of(box.uid) == []
    assert (await box.exec("echo next")).stdout == "next\n"


async def test_cpu_limit_ends_a_spinning_command(
    factory: BwrapSandboxFactory, settings: SandboxSettings
) -> None:
    tight = settings.model_copy(update={"limits": settings.limits.model_copy(update={"cpu_time_s": 1})})
    box = BwrapSandboxFactory(tight).create(None)
    await box.start()
    try:
        result = await box.exec("python3 -c 'while True: pass'", timeout=120)
    finally:
        await box.stop()
    assert not result.timed_out
    assert result.killed_reason == "cpu", result


async def test_process_and_file_size_limits_are_classified(settings: SandboxSettings) -> None:
    small = settings.limits.model_copy(update={"file_size_mb": 1, "max_processes": 16})
    box = BwrapSandboxFactory(settings.model_copy(update={"limits": small})).create(None)
    await box.start()
    try:
        too_big = await box.exec("head -c 2000000 /dev/zero > big.bin", timeout=60)
        size = (await box.exec("stat -c %s big.bin")).stdout.strip()
        too_many = await box.exec("for i in $(seq 40); do sleep 2 & done; wait", timeout=60)
    finally:
        await box.stop()
    assert too_big.killed_reason == "file_size", too_big
    assert size == str(1 << 20)
    assert too_many.exit_code != 0 and too_many.killed_reason == "processes", too_many
