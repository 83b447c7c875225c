"""The exec helper's protocol, with the real binary run as PID 1 of its own PID namespace on
this host (`unshare --pid --fork --mount-proc`), no container engine involved: exec results
and their edge cases, output kept by the same rule as every backend, timeouts that end every
process, files in and out (pax names, links, modes, refused names), bad requests, and a
host that hangs up."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sandboxes.docker_channel import ChannelGone, ChannelRefused
from sandboxes.docker_helper import helper_binary
from sandboxes.docker_helper_channel import HelperChannel, HelperConnection, exec_result_from
from sandboxes.output import STDERR, STDOUT, OutputCollector
from sandboxes.settings import SandboxSettings
from sandboxes.transfer import tar_path

pytestmark = pytest.mark.timeout(120)


@dataclass
class Helper:
    channel: HelperChannel
    process: asyncio.subprocess.Process
    directory: Path


def _unshare_available() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.fixture
async def helper() -> AsyncIterator[Helper]:
    if not _unshare_available():
        pytest.skip("needs unshare --pid (root) to give the helper a PID namespace of its own")
    settings = SandboxSettings.model_validate({"limits": {"output_limit_bytes": 4000}})
    binary = await asyncio.to_thread(helper_binary, settings.docker)
    root = Path(tempfile.mkdtemp(prefix="rs-helper-"))  # short: a socket path holds 108 bytes
    process: asyncio.subprocess.Process | None = None

    async def state() -> str:
        return "running" if process is not None and process.returncode is None else "exited"

    channel = HelperChannel(settings, binary, root / "channel", state)
    await channel.prepare()
    token = channel.container_changes()["Cmd"][3]
    argv = ["unshare", "--pid", "--fork", "--mount-proc", str(binary)]
    argv += ["--connect", str(root / "channel" / "h.sock"), "--token", token]
    process = await asyncio.create_subprocess_exec(*argv, cwd=root)
    await channel.open("")
    try:
        yield Helper(channel, process, root)
    finally:
        await channel.close()
        await asyncio.wait_for(process.wait(), 30)
        shutil.rmtree(root, ignore_errors=True)


async def test_results_streams_env_cwd_and_bytes(helper: Helper) -> None:
    result = await helper.channel.exec(
        "echo out; echo err >&2; echo $GREETING; pwd; printf '\\377\\n'; exit 3",
        timeout_s=30,
        cwd="/tmp",
        env={"GREETING": "hi there"},
    )
    assert result.exit_code == 3 and not result.timed_out and result.killed_reason is None
    assert result.stdout == "out\nhi there\n/tmp\n\ufffd\n" and result.stderr == "err\n"
    assert result.output_bytes == len(b"out\nhi there\n/tmp\n\xff\n") + len("err\n")

    heredoc = "x" * 100_000  # a command may carry a file in a heredoc, up to the kernel's 128 KiB an argument
    written = await helper.channel.exec(
        f"cat > big <<'EOF'\n{heredoc}\nEOF\nwc -c < big", timeout_s=30, cwd=str(helper.directory), env={}
    )
    assert written.stdout == "100001\n"
    too_long = await helper.channel.exec("#" + "x" * 200_000, timeout_s=30, cwd="/", env={})
    assert too_long.exit_code == 126 and "Argument list too long" in too_long.stderr

    unicode = await helper.channel.exec("echo 'héllo ✓ 𝄞'", timeout_s=30, cwd="/", env={"NAME": "ü"})
    assert unicode.stdout == "héllo ✓ 𝄞\n"  # JSON's \\u escapes, surrogate pairs included
    raw = b"\xff\xfe".decode("utf-8", "surrogateescape")  # bytes that are not UTF-8, as Python carries them
    carried = await helper.channel.exec(f"printf '%s' '{raw}' | od -An -tx1", timeout_s=30, cwd="/", env={})
    assert carried.stdout.split() == ["ff", "fe"]

    killed = await helper.channel.exec("kill -9 $$", timeout_s=30, cwd="/", env={})
    assert killed.exit_code == 137 and not killed.timed_out

    missing = await helper.channel.exec("true", timeout_s=30, cwd="/no/such/dir", env={})
    assert missing.exit_code == 126 and "cannot change to /no/such/dir" in missing.stderr


async def test_output_is_kept_by_the_same_rule_as_every_backend(helper: Helper) -> None:
    command = "seq 1 3000; seq 1 500 >&2; echo done"
    result = await helper.channel.exec(command, timeout_s=30, cwd="/", env={})
    expected = OutputCollector(4000)  # the fixture's output_limit_bytes
    printed = subprocess.run(["sh", "-c", command], capture_output=True, check=True)
    expected.add(STDOUT, printed.stdout)
    expected.add(STDERR, printed.stderr)
    kept = expected.result()
    assert result.stdout.encode() == kept.stdout and result.stderr.encode() == kept.stderr
    assert result.output_bytes == kept.total_bytes and result.output_truncated
    assert result.stdout.endswith("2999\n3000\ndone\n") and "bytes not kept" in result.stdout


async def test_a_timeout_ends_every_process_but_the_helper(helper: Helper) -> None:
    command = "sleep 301 & setsid sleep 302 & (trap '' TERM; sleep 303) & echo started; sleep 304"
    result = await helper.channel.exec(command, timeout_s=1, cwd="/", env={})
    assert result.timed_out and result.killed_reason == "timeout" and result.exit_code == 137
    assert result.stdout == "started\n" and 1.0 <= result.duration_s < 10
    listing = await helper.channel.exec(
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done", timeout_s=30, cwd="/", env={}
    )
    assert "sleep 30" not in listing.stdout

    sleeps = 'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = sleep ] && echo $p; done; true'
    await helper.channel.exec("(sleep 305 > /dev/null 2>&1 &)", timeout_s=30, cwd="/", env={})
    left = await helper.channel.exec(sleeps, timeout_s=30, cwd="/", env={})
    assert len(left.stdout.split()) == 1  # a process that outlives its command is kept...
    await helper.channel.exec("sleep 5", timeout_s=0.5, cwd="/", env={})
    after = await helper.channel.exec(sleeps, timeout_s=30, cwd="/", env={})
    assert after.stdout == ""  # ...until the next timeout (or the end of the sandbox)


async def test_files_round_trip_with_long_names_links_and_modes(helper: Helper, tmp_path: Path) -> None:
    source = tmp_path / "src"
    deep = source / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    (deep / "long-named.bin").write_bytes(os.urandom(300_000))
    (source / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (source / "run.sh").chmod(0o755)
    (source / "link").symlink_to("run.sh")
    os.link(source / "run.sh", source / "hard.sh")
    (source / "empty").mkdir()
    inside = helper.directory / "in"  # the helper shares this host's file system (not its PIDs)
    await helper.channel.put(tar_path(source, str(inside).lstrip("/")))
    check = await helper.channel.exec(
        "./link; ls -A | sort | tr '\\n' ' '", timeout_s=30, cwd=str(inside), env={}
    )
    assert check.stdout == "ran\n" + "d" * 60 + " empty hard.sh link run.sh ", check

    archive = tmp_path / "back.tar"
    await helper.channel.get(str(inside), archive)
    with tarfile.open(archive) as back:
        names = set(back.getnames())
        assert f"in/{'d' * 60}/{'e' * 60}/long-named.bin" in names  # longer than 100 bytes: a pax header
        member = back.extractfile(f"in/{'d' * 60}/{'e' * 60}/long-named.bin")
        assert member is not None and member.read() == (deep / "long-named.bin").read_bytes()
        assert back.getmember("in/link").issym() and back.getmember("in/link").linkname == "run.sh"
        assert back.getmember("in/run.sh").mode == 0o755
        assert back.getmember("in/empty").isdir()


async def test_refused_transfers_are_errors_and_the_channel_stays_in_step(helper: Helper) -> None:
    escaping = io.BytesIO()
    with tarfile.open(fileobj=escaping, mode="w") as archive:
        base = str(helper.directory).lstrip("/")
        for name, data in ((f"{base}/ok.txt", b"fine\n"), (f"{base}/../../escaped.txt", b"no\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    with pytest.raises(ChannelRefused, match="leaves the target directory"):
        await helper.channel.put(escaping.getvalue())
    with pytest.raises(ChannelRefused) as missing:
        await helper.channel.get("/no/such/path", helper.directory / "x.tar")
    assert missing.value.errno == 2  # ENOENT
    with pytest.raises(ChannelRefused, match="checksum"):
        await helper.channel.put(b"not a tar archive at all" * 100)
    after = await helper.channel.exec(
        "cat ok.txt; ls ../escaped.txt", timeout_s=30, cwd=str(helper.directory), env={}
    )
    assert after.stdout == "fine\n" and after.exit_code != 0  # in step; nothing escaped


async def test_bad_requests_get_errors_and_a_broken_frame_ends_the_helper(helper: Helper) -> None:
    connection: HelperConnection = helper.channel._connection  # the raw frames, below HelperChannel
    with pytest.raises(ChannelRefused, match="unknown op"):
        await connection.call({"op": "launch"}, b"", 10)
    with pytest.raises(ChannelRefused, match="argv"):
        await connection.call({"op": "exec", "argv": [1, 2], "env": {}, "cwd": "/", "timeout_s": 1}, b"", 10)
    spawned = await connection.call(
        {"op": "exec", "argv": ["/no/such/program"], "env": {}, "cwd": "/", "timeout_s": 5}, b"", 10
    )
    assert exec_result_from(*spawned).exit_code == 127
    assert connection._writer is not None
    connection._writer.write((2**31).to_bytes(4, "big") + bytes(4))  # a header no helper reads
    await connection._writer.drain()
    assert await asyncio.wait_for(helper.process.wait(), 10) == 0
    with pytest.raises(ChannelGone):
        await helper.channel.exec("true", timeout_s=5, cwd="/", env={})


async def test_a_host_that_hangs_up_ends_the_helper_and_its_processes(helper: Helper) -> None:
    await helper.channel.exec("(sleep 600 > /dev/null 2>&1 &)", timeout_s=10, cwd="/", env={})
    await helper.channel.close()
    assert await asyncio.wait_for(helper.process.wait(), 10) == 0  # PID 1 gone: the namespace with it


def test_the_helper_refuses_to_run_outside_a_pid_namespace_of_its_own() -> None:
    binary = helper_binary(SandboxSettings().docker)
    result = subprocess.run([str(binary), "--connect", "/nonexistent", "--token", "t"], capture_output=True)
    assert result.returncode == 2 and b"must run as PID 1" in result.stderr
