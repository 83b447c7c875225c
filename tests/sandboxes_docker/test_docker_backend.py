"""The docker backend through podman's real Docker-compatible API: exec, limits,
isolation, labels and leak cleanup, file transfer, and typed infrastructure errors."""

from __future__ import annotations

import asyncio
import hashlib
import io
import socket
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxes.base import (
    BackendUnavailableError,
    SandboxLostError,
    SandboxStartError,
    SandboxTimeoutError,
)
from sandboxes.docker import DockerSandbox, DockerSandboxFactory, is_transient_start_error
from sandboxes.docker_api import (
    DockerApi,
    DockerApiError,
    DockerUnreachableError,
    ExitTrailerSink,
    tar_to_end_marker,
)
from sandboxes.output import STDERR, STDOUT, OutputCollector
from sandboxes.settings import SandboxSettings
from sandboxes.transfer import tar_directory

PROCESS_LIST = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"
# The container's pids cgroup counts forks it refused ("max N"), under cgroup v2 or v1.
PIDS_EVENTS = "cat /sys/fs/cgroup/pids.events 2>/dev/null || cat /sys/fs/cgroup/pids/pids.events"


async def test_exec_results_env_cwd_and_workspace(box: DockerSandbox) -> None:
    result = await box.exec(
        "python3 hello.py; cat pkg/data.txt; echo oops >&2; pwd; echo $GREETING", env={"GREETING": "hi there"}
    )
    assert result.exit_code == 0 and result.ok
    assert result.stdout.split("\n")[:4] == ["hello from the workspace", "42", "/workspace", "hi there"]
    assert result.stderr == "oops\n"
    assert result.output_bytes == len(result.stdout) + len(result.stderr)

    failed = await box.exec("exit 3")
    assert failed.exit_code == 3 and not failed.timed_out and not failed.ok

    assert (await box.exec("pwd", cwd="/tmp")).stdout == "/tmp\n"
    assert (await box.exec("python3 -c 'import pytest; print(pytest.__name__)'")).stdout == "pytest\n"
    assert box.timings.start_s > 0 and len(box.timings.execs) == 4


async def test_exit_code_comes_in_band_and_inspect_covers_a_killed_wrapper(box: DockerSandbox) -> None:
    for command, code in (("true", 0), ("echo err >&2; exit 42", 42), ("no-such-command", 127)):
        result = await box.exec(command)
        assert result.exit_code == code and "rollstream-exit" not in result.stderr, (command, result)
    assert (await box.exec("echo err >&2; exit 42")).stderr == "err\n"
    # The command kills the wrapper that would report its status (timeout's parent): no
    # trailer arrives, so the code is the exec's own, as the engine reports it.
    killer = "read -r _ _ _ wrapper _ < /proc/$PPID/stat; kill -9 $wrapper"
    result = await box.exec(killer)
    assert result.exit_code == 137 and "rollstream-exit" not in result.stderr, result


def test_exit_trailer_is_found_across_frames_and_only_with_its_nonce() -> None:
    frames: list[tuple[int, bytes]] = []
    sink = ExitTrailerSink(lambda stream, data: frames.append((stream, data)), "n0nce")
    for stream, data in ((STDERR, b"warning\n[rollstream-ex"), (STDOUT, b"out"), (STDERR, b"it:n0nce:3]")):
        sink.add(stream, data)
    assert sink.finish() == 3
    assert b"".join(d for s, d in frames if s == STDERR) == b"warning\n"
    assert b"".join(d for s, d in frames if s == STDOUT) == b"out"

    frames.clear()
    spoofed = ExitTrailerSink(lambda stream, data: frames.append((stream, data)), "n0nce")
    spoofed.add(STDERR, b"x" * 5000 + b"[rollstream-exit:other:0]")
    assert spoofed.finish() is None  # another nonce is output, kept whole
    assert b"".join(d for _, d in frames) == b"x" * 5000 + b"[rollstream-exit:other:0]"


def test_archives_end_at_the_tar_marker_with_every_byte_of_their_members(tmp_path: Path) -> None:
    """podman's copier exits at the marker; padding after it broke uploads with a 500."""
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "zeros.bin").write_bytes(b"z" + bytes(8191))  # member data ending in zero blocks
    (tmp_path / "ws" / "a.txt").write_text("a\n")
    padded = tar_directory(tmp_path / "ws", "/workspace")
    cut = tar_to_end_marker(padded)
    assert len(padded) % tarfile.RECORDSIZE == 0 and len(cut) < len(padded)
    assert cut.endswith(bytes(1024)) and cut == padded[: len(cut)] and not any(padded[len(cut) :])
    with tarfile.open(fileobj=io.BytesIO(cut)) as archive:
        member = archive.extractfile("workspace/zeros.bin")
        assert member is not None and member.read() == b"z" + bytes(8191)
    assert tar_to_end_marker(cut) == cut
    assert tar_to_end_marker(b"not a tar") == b"not a tar"


async def test_uploads_into_a_created_container_survive_bytes_past_the_marker(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi, tmp_path: Path
) -> None:
    """A start uploads the workspace before the container runs; podman's copier child then
    exits at the marker, and bytes past it that the pipe cannot hold made the upload a
    500 (`passing bulk input to subprocess: write |1: broken pipe`) — always with 1 MiB
    of them, sometimes with tarfile's 10 KiB record padding on a busy machine."""
    factory = make_factory()
    container = await raw_api.create_container(factory.container_body(factory.settings.docker.image))
    (tmp_path / "ws").mkdir()
    data = b"z" + bytes(8191)
    (tmp_path / "ws" / "zeros.bin").write_bytes(data)
    padded = tar_directory(tmp_path / "ws", "/workspace") + bytes(1024 * 1024)
    try:
        await raw_api.put_archive(container, "/", padded)
        await raw_api.start_container(container)
        result = await raw_api.exec_run(
            container,
            ["sha256sum", "/workspace/zeros.bin"],
            env=[],
            workdir=None,
            output=(output := OutputCollector(4096)),
            timeout_s=60,
        )
    finally:
        await raw_api.remove_container(container)
    assert result == 0 and output.result().stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


def test_only_transient_engine_errors_are_retried() -> None:
    assert is_transient_start_error(DockerApiError(500, "passing bulk input to subprocess: broken pipe"))
    assert is_transient_start_error(DockerUnreachableError("docker API timed out"))
    assert not is_transient_start_error(DockerApiError(409, "name already in use"))
    assert not is_transient_start_error(DockerApiError(500, "error setting rlimit type 7"))


async def test_timeout_kills_the_whole_process_tree(box: DockerSandbox) -> None:
    result = await box.exec("sleep 996 & setsid sleep 997 & sleep 998 & sleep 999", timeout=2)
    assert result.timed_out and result.killed_reason == "timeout"
    assert result.exit_code in (124, 137)
    survivors = await box.exec(PROCESS_LIST)
    assert "sleep 99" not in survivors.stdout
    assert (await box.exec("echo still here")).stdout == "still here\n"


async def test_no_network_reaches_the_host_or_outside(box: DockerSandbox) -> None:
    """A listener the host itself can reach (on every interface) is unreachable inside."""
    server = await asyncio.start_server(lambda _r, w: w.close(), host="0.0.0.0", port=0)
    port = server.sockets[0].getsockname()[1]
    host = _host_address()
    _, writer = await asyncio.open_connection(host, port)  # the host reaches it
    writer.close()
    targets = [("127.0.0.1", 19092), ("127.0.0.1", port), (host, port), ("1.1.1.1", 53)]
    probe = (
        "import socket, sys\n"
        "for host, port in zip(sys.argv[1::2], sys.argv[2::2]):\n"
        "    try:\n"
        "        socket.create_connection((host, int(port)), timeout=5); print('connected', host, port)\n"
        "    except OSError as e: print('failed', host, port, type(e).__name__)\n"
    )
    await box.exec(f"cat > /tmp/probe.py <<'EOF'\n{probe}EOF")
    argv = " ".join(f"{h} {p}" for h, p in targets)
    try:
        result = await box.exec(f"python3 /tmp/probe.py {argv}", timeout=60)
    finally:
        server.close()
    assert result.exit_code == 0, result.stderr
    assert "connected" not in result.stdout
    assert result.stdout.count("failed") == len(targets)


async def test_shared_internal_network_has_no_way_out(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi
) -> None:
    factory = make_factory(docker={"network": "shared-internal", "network_name": "rollstream-test-internal"})
    box = factory.create(None)
    await box.start()
    try:
        network = (await raw_api.request("GET", "/networks/rollstream-test-internal")).json()
        assert network["Internal"] is True
        code = "import socket; socket.create_connection(('{}', {}), timeout=5)"
        for host, port in (("127.0.0.1", 19092), ("1.1.1.1", 53)):
            result = await box.exec(f'python3 -c "{code.format(host, port)}"', timeout=60)
            assert result.exit_code != 0 and "Error" in result.stderr, (host, result)
    finally:
        await box.stop()
        await raw_api.request("DELETE", "/networks/rollstream-test-internal")


async def test_labels_and_only_leaked_containers_are_cleaned(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi
) -> None:
    first = make_factory()
    box = first.create(None)
    await box.start()
    labels = (await raw_api.inspect_container(box.container_id))["Config"]["Labels"]
    assert labels["rollstream.sandbox"] == "1"
    assert labels["rollstream.sandbox.run"] == first.run_id
    assert labels["rollstream.sandbox.owner"] == first.owner

    dead_owner = f"{socket.gethostname()}/999999999/0"
    body = first.container_body(first.settings.docker.image)
    body["Labels"] = {**first.labels, "rollstream.sandbox.owner": dead_owner}
    leaked = await raw_api.create_container(body)

    second = make_factory()
    assert await second.cleanup_leaked() == 1
    with pytest.raises(DockerApiError) as gone:
        await raw_api.inspect_container(leaked)
    assert gone.value.status == 404
    assert (await box.exec("echo alive")).stdout == "alive\n"  # a live owner's sandbox is kept
    await box.stop()


async def test_warm_sandbox_takes_its_workspace_later(
    make_factory: Callable[..., DockerSandboxFactory], tmp_path: Path
) -> None:
    box = make_factory().create(None)
    await box.start()
    assert (await box.exec("ls -A")).stdout == ""
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "task.py").write_text("x = 1\n")
    await box.attach_workspace(tmp_path / "repo")
    assert (await box.exec("cat task.py")).stdout == "x = 1\n"
    await box.stop()


async def test_upload_download_round_trip(box: DockerSandbox, tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "deep" / "er").mkdir(parents=True)
    (source / "deep" / "er" / "f.bin").write_bytes(bytes(range(256)) * 100)
    (source / "top.txt").write_text("top\n")
    single = tmp_path / "single.txt"
    single.write_text("one file\n")

    await box.upload(source, "uploaded")
    await box.upload(single, "/opt/new/dir/single.txt")
    listing = await box.exec("cat uploaded/top.txt /opt/new/dir/single.txt; wc -c < uploaded/deep/er/f.bin")
    assert listing.stdout == "top\none file\n25600\n"

    await box.exec("mkdir -p out/sub && echo made inside > out/sub/made.txt")
    await box.download("out", tmp_path / "back")
    assert (tmp_path / "back" / "sub" / "made.txt").read_text() == "made inside\n"
    await box.download("uploaded/deep/er/f.bin", tmp_path / "f.bin")
    assert (tmp_path / "f.bin").read_bytes() == (source / "deep" / "er" / "f.bin").read_bytes()
    with pytest.raises(FileNotFoundError):
        await box.download("no/such/file", tmp_path / "missing")


async def test_output_limit_keeps_head_and_tail_and_counts_all(
    make_factory: Callable[..., DockerSandboxFactory],
) -> None:
    box = make_factory(limits={"output_limit_bytes": 4000}).create(None)
    await box.start()
    command = "echo START; head -c 30000000 /dev/zero | tr '\\0' x; echo; echo END"
    result = await box.exec(command, timeout=120)
    await box.stop()
    assert result.exit_code == 0 and result.output_truncated
    assert result.output_bytes == len("START\n") + 30_000_000 + len("\nEND\n")
    assert result.stdout.startswith("START\nxxx") and result.stdout.endswith("xxx\nEND\n")
    assert "bytes not kept" in result.stdout and len(result.stdout) < 4000


async def test_fork_bomb_and_memory_hog_are_contained(
    make_factory: Callable[..., DockerSandboxFactory],
) -> None:
    box = make_factory(limits={"max_processes": 64, "memory_mb": 256}).create(None)
    await box.start()
    # The command's shell forks twice, both before the bomb exists (`sleep 60`, then the
    # bomb's root shell as one child), and then only waits (a builtin): it never needs a
    # free pid again, so it cannot die of "Cannot fork" and lives until the timeout kills
    # its whole process group. Without the pids cap the cgroup would count no refused
    # fork (`pids.events`) and the bomb's shells would print no "Cannot fork"; without the
    # group kill, bomb shells would survive the timeout.
    bomb = await box.exec("sleep 60 & sh -c 'f(){ f|f& }; f' & wait", timeout=5)
    assert bomb.timed_out and bomb.killed_reason == "timeout"
    assert "Cannot fork" in bomb.stderr  # the pids limit held; a result, not an error
    events = await box.exec(PIDS_EVENTS)
    refused = int(events.stdout.split()[-1])
    assert events.stdout.startswith("max ") and refused > 0, events  # the cgroup's cap refused forks
    survivors = await box.exec(PROCESS_LIST)
    assert "f(){" not in survivors.stdout
    hog = await box.exec("python3 -c 'b = bytearray(1024**3); print(len(b))'", timeout=120)
    assert hog.exit_code == 137 and not hog.timed_out and hog.killed_reason == "memory"
    assert (await box.exec("echo fine")).stdout == "fine\n"
    await box.stop()


async def test_stop_removes_the_container_and_a_vanished_one_is_lost(
    box: DockerSandbox, make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi
) -> None:
    container = box.container_id
    await box.stop()
    await box.stop()  # idempotent
    with pytest.raises(DockerApiError):
        await raw_api.inspect_container(container)
    with pytest.raises(SandboxLostError):
        await box.exec("true")

    other = make_factory().create(None)
    await other.start()
    await raw_api.remove_container(other.container_id)  # the engine loses it behind our back
    with pytest.raises(SandboxLostError):
        await other.exec("true")
    await other.stop()


async def test_a_frozen_sandbox_is_a_timeout_not_a_result(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi
) -> None:
    box = make_factory(docker={"exec_grace_s": 2.0}).create(None)
    await box.start()
    running = asyncio.create_task(box.exec("sleep 0.5; echo done", timeout=1))
    await asyncio.sleep(0.2)
    await raw_api.request("POST", f"/containers/{box.container_id}/pause")
    with pytest.raises(SandboxTimeoutError):  # whether the exec was under way or not yet created
        await running
    with pytest.raises(SandboxTimeoutError):
        await box.exec("echo hello", timeout=1)
    await raw_api.request("POST", f"/containers/{box.container_id}/unpause")
    assert (await box.exec("echo thawed", timeout=30)).stdout == "thawed\n"
    await box.stop()


async def test_missing_api_socket_is_a_typed_start_error(tmp_path: Path) -> None:
    settings = SandboxSettings.model_validate({"docker": {"base_url": f"unix://{tmp_path}/none.sock"}})
    box = DockerSandboxFactory(settings).create(None)
    with pytest.raises(BackendUnavailableError) as error:
        await box.start()
    assert "rollstream.launcher.podman up" in str(error.value) and error.value.kind == "sandbox_start"

    with pytest.raises(ValueError, match="api_connections"):  # a cap below the pool's is refused
        DockerSandboxFactory(
            SandboxSettings.model_validate({"docker": {"api_connections": 8}, "pool": {"max_running": 64}})
        )

    stale = tmp_path / "stale.sock"  # a socket file left behind by a service that died
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(stale))
    settings = SandboxSettings.model_validate({"docker": {"base_url": f"unix://{stale}"}})
    with pytest.raises(BackendUnavailableError, match="unreachable"):
        await DockerSandboxFactory(settings).create(None).start()


async def test_missing_image_pulls_are_counted_and_capped(
    make_factory: Callable[..., DockerSandboxFactory],
) -> None:
    no_pull = make_factory(docker={"pull_missing": False})
    with pytest.raises(SandboxStartError, match="pull_missing"):
        await no_pull.create(None, image="rollstream-missing:none").start()
    assert no_pull.pulls == 0

    capped = make_factory(pool={"image_pulls_per_h": 1})
    with pytest.raises(SandboxStartError, match="pulling it failed"):  # no registry reachable here
        await capped.create(None, image="rollstream-missing:none").start()
    assert capped.pulls == 1
    with pytest.raises(SandboxStartError, match="image_pulls_per_h=1"):
        await capped.create(None, image="rollstream-missing:other").start()
    assert capped.pulls == 1


def _host_address() -> str:
    """This machine's outward address (where a service bound to 0.0.0.0 would listen)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.255", 1))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"
