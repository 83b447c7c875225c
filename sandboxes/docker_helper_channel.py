"""`HelperChannel`: a docker sandbox's commands and files through our exec helper (`sandboxes/helper/`).

Channel. Each sandbox has a host directory `<channel_root>/<pid>-<sandbox id>/`, bind-mounted
read-only at `/.rollstream/run` into its container only, next to the helper binary at
`/.rollstream/exec`. The host listens on `h.sock` there before the container is created;
the helper, the container's PID 1, connects and says hello with the sandbox's token; the
host then closes the listener and removes the socket file. From then on nothing in the
container listens and nothing can connect: not a command in this sandbox (the helper's
one connection is not inherited, the helper is not dumpable), nor one in another (no
container sees another's directory). No network port is involved: containers keep having
no network.

Wire format, both ways: an 8-byte prefix (header length, payload length: big-endian
uint32), a JSON header, raw payload bytes. Nothing depends on an interpreter's version:
the helper is a static C binary, and the image needs no Python. Requests (`exec`, `put`,
`get`) and replies are listed in `sandboxes/helper/main.c`.

Requests are answered in order, each matched by its id: a caller whose deadline passed
leaves its reply to be dropped, and the next caller's deadline grows by what the helper
still has to finish first (`_busy_until`), as in the bwrap backend.

Errors (`sandboxes/docker_channel.py`): `ChannelGone` when the connection closes (the
helper died, or the container was removed or killed), `ChannelSilent` when no reply
comes within a deadline (a paused or stuck sandbox), `ChannelRefused` when the helper
answers a request with an error (a path that does not exist).

Files go through the helper too (`put`: a tar archive it extracts as it arrives; `get`: a
tar archive of a path), not the engine's archive endpoints: measured here on a 41-file
workspace in one running container (load ~6), put 11 ms against the engine's 15 ms
(both onto the container's disk; 0.5-2 ms into the in-memory workspace), get of one
file 8 ms against 200 ms; and they keep the engine out of every handoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import secrets
import shutil
import struct
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from sandboxes.base import ExecResult
from sandboxes.docker_channel import ChannelGone, ChannelRefused, ChannelSilent
from sandboxes.output import ExecOutput, classified_result, kept_bytes
from sandboxes.settings import SandboxSettings

FRAME_PREFIX = struct.Struct(">II")
MAX_HEADER_BYTES = 64 << 20
PROTOCOL_VERSION = 1
SOCKET_NAME = "h.sock"
HELPER_IN_CONTAINER = "/.rollstream/exec"
RUN_DIR_IN_CONTAINER = "/.rollstream/run"
STATE_POLL_S = 1.0  # while waiting for the hello, how often to ask whether the container still runs

Reply = tuple[dict[str, Any], bytes]


def encode_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    body = json.dumps(header, separators=(",", ":")).encode()
    return FRAME_PREFIX.pack(len(body), len(payload)) + body + payload


async def read_frame(reader: asyncio.StreamReader) -> Reply:
    """One frame; `ChannelGone` when the stream ends or is out of step."""
    try:
        header_len, payload_len = FRAME_PREFIX.unpack(await reader.readexactly(FRAME_PREFIX.size))
        if header_len > MAX_HEADER_BYTES:
            raise ChannelGone(f"the helper sent a {header_len}-byte header: out of step")
        header = json.loads(await reader.readexactly(header_len))
        payload = await reader.readexactly(payload_len) if payload_len else b""
    except (asyncio.IncompleteReadError, ConnectionError) as error:
        raise ChannelGone(f"the helper's connection closed ({type(error).__name__})") from None
    except ValueError as error:
        raise ChannelGone(f"the helper sent a header that is not JSON: {error}") from None
    if not isinstance(header, dict):
        raise ChannelGone(f"the helper sent {header!r} instead of an object")
    return header, payload


def container_changes(binary: Path, directory: Path, token: str) -> dict[str, Any]:
    """What makes a container run the helper as PID 1 on this channel (merged into its body)."""
    return {
        "Entrypoint": [HELPER_IN_CONTAINER],
        "Cmd": ["--connect", f"{RUN_DIR_IN_CONTAINER}/{SOCKET_NAME}", "--token", token],
        "Binds": [f"{binary}:{HELPER_IN_CONTAINER}:ro", f"{directory}:{RUN_DIR_IN_CONTAINER}:ro"],
    }


class HelperConnection:
    """The connection to one sandbox's helper: listen, take its hello, then request and reply."""

    def __init__(self, directory: Path, token: str) -> None:
        self.directory = directory
        self._token = token
        self._socket = directory / SOCKET_NAME
        self._server: asyncio.AbstractServer | None = None
        self._connected: asyncio.Future[tuple[asyncio.StreamReader, asyncio.StreamWriter]] | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[Reply]] = {}
        self._ids = itertools.count()
        self._write_lock = asyncio.Lock()
        self._gone: str | None = None
        self._busy_until = 0.0

    async def listen(self) -> None:
        """Create the directory and listen on its socket (before the container exists)."""
        self.directory.mkdir(mode=0o755)
        self.directory.chmod(0o755)  # the container's user may not be ours (user namespaces)
        self._connected = asyncio.get_running_loop().create_future()
        self._server = await asyncio.start_unix_server(self._accept, path=str(self._socket))
        self._socket.chmod(0o666)

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._connected is None or self._connected.done():
            writer.close()  # only the first connection counts; the listener closes right after it
            return
        self._connected.set_result((reader, writer))

    async def wait_ready(self, timeout_s: float, container_state: Callable[[], Awaitable[str]]) -> int:
        """Wait for the helper's hello (its pid); `ChannelGone` if the container stops first."""
        assert self._connected is not None
        deadline = time.monotonic() + timeout_s
        while not self._connected.done():
            left = deadline - time.monotonic()
            if left <= 0:
                raise ChannelSilent(f"the helper did not connect within {timeout_s:.0f}s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._connected), min(left, STATE_POLL_S))
            if not self._connected.done() and (state := await container_state()) != "running":
                raise ChannelGone(f"the container is {state} and its helper never connected")
        reader, self._writer = self._connected.result()
        await self._stop_listening()
        try:
            hello, _ = await asyncio.wait_for(read_frame(reader), max(deadline - time.monotonic(), 1.0))
        except TimeoutError:
            raise ChannelSilent("the helper connected but sent no hello") from None
        if hello.get("op") != "ready" or hello.get("token") != self._token:
            raise ChannelGone(f"a stranger connected instead of the helper: {hello!r}")
        if hello.get("version") != PROTOCOL_VERSION:
            raise ChannelGone(
                f"helper protocol {hello.get('version')}, expected {PROTOCOL_VERSION}: rebuild it"
            )
        self._reader_task = asyncio.get_running_loop().create_task(self._read_replies(reader))
        return int(hello.get("pid", 0))

    async def call(self, header: dict[str, Any], payload: bytes, wait_s: float) -> Reply:
        """Send one request and wait up to `wait_s` (plus unfinished earlier work) for its reply."""
        if self._gone is not None or self._writer is None:
            raise ChannelGone(self._gone or "the helper is not connected")
        request_id = next(self._ids)
        waiter: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = waiter
        try:
            async with asyncio.timeout(None) as deadline:
                async with self._write_lock:
                    now = time.monotonic()
                    wait_s += max(0.0, self._busy_until - now)  # the helper finishes abandoned work first
                    self._busy_until = now + wait_s
                    # the drain too: a frozen helper reads no payload, and a full socket blocks it
                    deadline.reschedule(asyncio.get_running_loop().time() + wait_s)
                    self._writer.write(encode_frame({**header, "id": request_id}, payload))
                    await self._writer.drain()
                reply = await waiter
        except TimeoutError:
            raise ChannelSilent(f"no reply from the helper within {wait_s:.1f}s") from None
        except ConnectionError as error:
            raise ChannelGone(f"the helper's connection broke: {error}") from None
        finally:
            self._pending.pop(request_id, None)
        self._busy_until = 0.0 if not self._pending else self._busy_until  # in order: all before are done
        if "error" in reply[0]:
            raise ChannelRefused(str(reply[0]["error"]), int(reply[0].get("errno", 0)))
        return reply

    async def _read_replies(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                header, payload = await read_frame(reader)
                waiter = self._pending.get(int(header.get("id", -1)))
                if waiter is not None and not waiter.done():
                    waiter.set_result((header, payload))
        except ChannelGone as error:
            self._gone = str(error)
            for waiter in self._pending.values():
                if not waiter.done():
                    waiter.set_exception(ChannelGone(self._gone))

    @property
    def gone(self) -> str | None:
        """Why the connection closed, or None while it is open."""
        return self._gone

    async def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        self._socket.unlink(missing_ok=True)

    async def close(self) -> None:
        """Hang up (the helper then exits, ending its container) and stop listening."""
        await self._stop_listening()
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._connected is not None and not self._connected.done():
            self._connected.cancel()
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(Exception):
                await self._writer.wait_closed()
        self._gone = self._gone or "the channel was closed"
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(ChannelGone(self._gone))


def new_channel_dir(root: Path, sandbox_id: str) -> Path:
    """`<root>/<pid>-<sandbox id>` (the pid lets a later process remove what a dead one left)."""
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    return root / f"{os.getpid()}-{sandbox_id}"


def exec_result_from(header: dict[str, Any], payload: bytes) -> ExecResult:
    """The helper's exec reply as an `ExecResult`: kept bytes, counts, how it ended."""
    kept, offset, total, truncated = [], 0, 0, False
    for stream in ("stdout", "stderr"):
        head_len, tail_len, stream_total = (int(n) for n in header[stream])
        head = payload[offset : offset + head_len]
        tail = payload[offset + head_len : offset + head_len + tail_len]
        offset += head_len + tail_len
        kept.append(kept_bytes(head, tail, stream_total))
        total += stream_total
        truncated = truncated or head_len + tail_len < stream_total
    output = ExecOutput(kept[0], kept[1], total, truncated)
    return classified_result(
        int(header["exit_code"]), output, float(header["duration_s"]), bool(header["timed_out"])
    )


class HelperChannel:
    """A `Channel` (`sandboxes/docker_channel.py`) through the helper, PID 1 of the container."""

    def __init__(
        self, settings: SandboxSettings, binary: Path, directory: Path, state: Callable[[], Awaitable[str]]
    ) -> None:
        self._settings = settings
        self._binary = binary
        self._directory = directory
        self._state = state
        self._token = secrets.token_hex(16)
        self._connection = HelperConnection(directory, self._token)

    def container_changes(self) -> dict[str, Any]:
        return container_changes(self._binary, self._directory, self._token)

    async def prepare(self) -> None:
        await self._connection.listen()

    async def open(self, container_id: str) -> None:
        await self._connection.wait_ready(self._settings.docker.helper_ready_timeout_s, self._state)

    async def exec(self, command: str, *, timeout_s: float, cwd: str, env: dict[str, str]) -> ExecResult:
        limits = self._settings.limits
        request = {
            "op": "exec",
            "argv": ["/bin/sh", "-c", command],  # no PATH search: each miss is a lookup through the overlay
            "env": env,
            "cwd": cwd,
            "timeout_s": timeout_s,
            "drain_s": limits.output_drain_s,
            "output_limit": limits.output_limit_bytes,
        }
        wait_s = timeout_s + limits.output_drain_s + self._settings.docker.exec_grace_s
        header, payload = await self._connection.call(request, b"", wait_s)
        return exec_result_from(header, payload)

    async def put(self, archive: bytes) -> None:
        await self._connection.call({"op": "put", "path": "/"}, archive, self._io_wait_s())

    async def get(self, path: str, into: Path) -> None:
        _, archive = await self._connection.call({"op": "get", "path": path}, b"", self._io_wait_s())
        into.write_bytes(archive)

    async def close(self) -> None:
        await self._connection.close()
        shutil.rmtree(self._directory, ignore_errors=True)

    def diagnosis(self) -> str:
        return self._connection.gone or ""

    def _io_wait_s(self) -> float:
        return self._settings.limits.command_timeout_s + self._settings.docker.exec_grace_s
