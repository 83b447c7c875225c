"""Containment of the docker backend with the exec helper inside, through podman's real API:
host files, host processes, the network (the broker too), fork bombs and memory in an image
without Python; the helper itself (no signal, no /proc peek, no socket left to reach, not
another sandbox's); and a helper that dies, which is a typed infrastructure error and a
sandbox the pool replaces, never a command's result."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxes.base import SandboxLostError, SandboxTimeoutError
from sandboxes.docker import DockerSandbox, DockerSandboxFactory
from sandboxes.docker_api import DockerApi
from sandboxes.pool import SandboxPool

pytestmark = pytest.mark.timeout(300)
KAFKA_BROKER_PORT = 19092
CONNECT = """import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print(type(e).__name__)
else:
    print("CONNECTED")
"""


async def started(factory: DockerSandboxFactory, workspace: Path | None = None) -> DockerSandbox:
    box = factory.create(workspace)
    await box.start()
    return box


async def test_host_files_and_processes_stay_out_of_reach(
    make_factory: Callable[..., DockerSandboxFactory], no_python_image: str, tmp_path: Path
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host only\n")
    box = await started(make_factory(docker={"image": no_python_image}))
    try:
        files = await box.exec(
            f"cat {secret}; echo x > {tmp_path}/escaped; ls -A /.rollstream/run; touch /.rollstream/run/x;"
            " echo y > /.rollstream/exec; echo done"
        )
        processes = await box.exec(f"ls -d /proc/[0-9]* | wc -l; kill -0 {os.getpid()} && echo SIGNALLED")
    finally:
        await box.stop()
    assert "host only" not in files.stdout and files.stdout.endswith("done\n"), files
    assert not (tmp_path / "escaped").exists()
    assert "Read-only file system" in files.stderr and files.stdout == "done\n"  # the socket is gone too
    count, *rest = processes.stdout.split()
    assert int(count) <= 4 and rest == [], processes  # the helper, the shell, ls, wc: no host process


async def test_no_network_not_even_the_broker_in_an_image_without_python(
    make_factory: Callable[..., DockerSandboxFactory], no_python_image: str
) -> None:
    box = await started(make_factory(docker={"image": no_python_image}))
    try:
        probe = " ".join(
            f"nc -w 3 {host} {port} </dev/null && echo CONNECTED || echo refused;"
            for host, port in (("127.0.0.1", KAFKA_BROKER_PORT), ("1.1.1.1", 53), ("10.0.0.1", 80))
        )
        result = await box.exec(probe, timeout=60)
    finally:
        await box.stop()
    assert "CONNECTED" not in result.stdout and result.stdout.count("refused") == 3, result


async def test_fork_bomb_and_memory_in_an_image_without_python(
    make_factory: Callable[..., DockerSandboxFactory], no_python_image: str
) -> None:
    factory = make_factory(docker={"image": no_python_image}, limits={"max_processes": 64, "memory_mb": 256})
    box = await started(factory)
    try:
        bomb = await box.exec("f(){ f|f& }; f; sleep 30", timeout=5)
        after_bomb = await box.exec("echo helper survived")
        hog = await box.exec("head -c 600000000 /dev/zero | tail -c 500000000 > /dev/null", timeout=120)
        after_hog = await box.exec("echo still serving")
    finally:
        await box.stop()
    assert bomb.timed_out and bomb.killed_reason == "timeout", bomb
    assert after_bomb.stdout == "helper survived\n"  # one thread, no fork while the bomb ran: it lives
    assert hog.exit_code == 137 and not hog.timed_out and hog.killed_reason == "memory", hog
    assert after_hog.stdout == "still serving\n"


async def test_the_helper_cannot_be_signalled_peeked_at_or_reached(
    make_factory: Callable[..., DockerSandboxFactory],
) -> None:
    factory = make_factory()
    box = await started(factory)
    other = await started(factory)
    waiting = factory.channel_for("probe", lambda: asyncio.sleep(0, "running"))
    await waiting.prepare()  # a channel listening on the host, as during a start
    probe_socket = factory.channel_root / f"{os.getpid()}-probe" / "h.sock"
    try:
        assert probe_socket.exists()
        await box.exec(f"cat > /tmp/connect.py <<'EOF'\n{CONNECT}EOF")
        signals = await box.exec("for s in KILL TERM INT HUP STOP USR1; do kill -$s 1; done; echo sent")
        alive = await box.exec("echo alive")
        peek = await box.exec("readlink /proc/1/fd/4; cat /proc/1/fd/4; cat /proc/1/environ; echo -n peeked")
        reach = await box.exec(
            f"python3 /tmp/connect.py /.rollstream/run/h.sock; python3 /tmp/connect.py {probe_socket};"
            f" ls {factory.channel_root}"
        )
        others = await other.exec("echo other alive")
    finally:
        await waiting.close()
        await box.stop()
        await other.stop()
    assert (
        signals.stdout == "sent\n" and alive.stdout == "alive\n"
    )  # PID 1 takes no signal it has no handler for
    # not dumpable: its descriptors cannot be read or opened (readlink prints nothing), its memory not read
    assert peek.stdout == "peeked" and peek.stderr.count("Permission denied") == 2, peek
    assert reach.stdout == "FileNotFoundError\nFileNotFoundError\n", reach  # nothing listens, nothing to see
    assert "No such file" in reach.stderr and others.stdout == "other alive\n"


async def test_a_helper_that_dies_is_a_lost_sandbox_with_its_reason(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi
) -> None:
    box = await started(make_factory())
    try:
        running = asyncio.create_task(box.exec("sleep 60"))
        await asyncio.sleep(0.5)
        began = time.monotonic()
        await raw_api.request("POST", f"/containers/{box.container_id}/kill", params={"signal": "KILL"})
        with pytest.raises(SandboxLostError) as lost:
            await running
        assert time.monotonic() - began < 20  # noticed when the connection closed, not at the timeout
        assert "exit code 137" in str(lost.value) and lost.value.kind == "sandbox_lost"
        with pytest.raises(SandboxLostError):
            await box.exec("true")
    finally:
        await box.stop()


async def test_the_pool_replaces_a_warm_sandbox_whose_helper_died(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi, tmp_path: Path
) -> None:
    factory = make_factory(pool={"warm_pool": 1, "max_running": 4})
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "task.txt").write_text("task\n")
    async with SandboxPool(factory.settings, factory) as pool:
        deadline = time.monotonic() + 120
        while pool.stats().warm < 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for container in await raw_api.list_containers([f"rollstream.sandbox.run={factory.run_id}"]):
            await raw_api.request("POST", f"/containers/{container['Id']}/kill", params={"signal": "KILL"})
        async with pool.sandbox(tmp_path / "repo") as box:
            result = await box.exec("cat task.txt")
    assert result.stdout == "task\n"  # the dead warm one was dropped and another started


async def test_a_large_upload_into_a_frozen_sandbox_times_out_instead_of_hanging(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi, tmp_path: Path
) -> None:
    box = await started(make_factory(limits={"command_timeout_s": 2}, docker={"exec_grace_s": 1}))
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(32 << 20))  # far more than a socket buffer holds
    try:
        await raw_api.request("POST", f"/containers/{box.container_id}/pause")
        began = time.monotonic()
        with pytest.raises(SandboxTimeoutError, match="paused"):
            await box.upload(big, "big.bin")
        assert time.monotonic() - began < 15
        await raw_api.request("POST", f"/containers/{box.container_id}/unpause")
        assert (
            await box.exec("wc -c < big.bin", timeout=60)
        ).stdout == f"{32 << 20}\n"  # it arrived in the end
    finally:
        await box.stop()
