"""A small async client for the Docker Engine API (Docker or podman's compatible service).

Why not the `docker` SDK here: it is blocking, so every call would go through
`asyncio.to_thread`, whose default executor has min(32, cores + 4) threads — a hidden
cap of 6 concurrent execs on a 2-core host, exactly the kind of invisible limit this
project exists to remove. httpx speaks the same HTTP API natively async, over a unix
socket or TCP, with one connection pool whose size is a setting.

Exec: two calls per command (create, then start attached, reading the multiplexed
stdout/stderr frames). The command runs under a small `sh` wrapper that writes its
exit status to stderr after everything else, tagged with a per-exec nonce, so no
third call is needed for the exit code; only when that trailer is missing (the
wrapper itself was killed, e.g. by the OOM killer) is the exec inspected. The rest
of an exec's cost is the engine's own (podman: conmon + `runc exec` per command).

Archives: into a container that is not running yet (a start uploads its workspace
before starting it), podman (4.3, buildah's copier) pipes the body to a chrooted
child that stops reading at tar's end-of-archive marker and exits; whatever of the
body past the marker the pipe cannot hold then fails the upload with `500 passing
bulk input to subprocess: write |1: broken pipe` — always with 1 MiB past it, and
now and then, on a busy machine, with the ≤10 KiB record padding of Python's
`tarfile`. `put_archive` therefore sends archives cut at the marker
(`tar_to_end_marker`). (Into a running container podman takes another path that
reads the whole body.)

Errors: `DockerUnreachableError` when nothing answers at the address, `DockerApiError`
(with the HTTP status) when the API answers with an error. Callers map both to the
sandbox layer's typed errors.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
import struct
import tarfile
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx

from sandboxes.output import STDERR, OutputCollector

API_VERSION = "v1.41"
TAR_END_MARKER = bytes(2 * tarfile.BLOCKSIZE)  # two zero blocks end a tar archive
EXIT_TRAILER = "[rollstream-exit:{nonce}:"
LIST_ATTEMPTS = 3


class DockerUnreachableError(Exception):
    """Nothing answers at the API address (no socket, refused, timed out)."""


class DockerApiError(Exception):
    """The API answered with an error status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"docker API error {status}: {message}")
        self.status = status
        self.message = message


def unix_socket_path(base_url: str) -> str | None:
    """`unix:///run/x.sock` -> `/run/x.sock`; None for tcp/http addresses."""
    for prefix in ("unix://", "http+unix://"):
        if base_url.startswith(prefix):
            return "/" + base_url[len(prefix) :].lstrip("/")
    return None


def http_base(base_url: str) -> str:
    if unix_socket_path(base_url) is not None:
        return f"http://docker/{API_VERSION}"
    return base_url.replace("tcp://", "http://").rstrip("/") + f"/{API_VERSION}"


async def demux_frames(chunks: AsyncIterator[bytes], sink: Callable[[int, bytes], None]) -> None:
    """Split Docker's multiplexed stream (8-byte header: stream, 0,0,0, big-endian size)."""
    buffer = bytearray()
    need_header = True
    stream, size = 0, 8
    async for chunk in chunks:
        buffer.extend(chunk)
        while len(buffer) >= size:
            if need_header:
                stream, size = buffer[0], struct.unpack(">I", bytes(buffer[4:8]))[0]
                del buffer[:8]
                need_header = False
            else:
                sink(stream, bytes(buffer[:size]))
                del buffer[:size]
                need_header, size = True, 8
            if not need_header and size == 0:
                need_header, size = True, 8


def tar_to_end_marker(archive: bytes) -> bytes:
    """`archive` cut right after its end-of-archive marker (the record padding dropped).

    Member data may itself end in zero blocks, so the end is found by walking the
    headers, never by stripping zeros. An archive with anything but zeros past the
    marker is returned unchanged.
    """
    try:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as reader:
            for _ in reader:  # reading the headers only; member data is skipped
                pass
            end = reader.offset + len(TAR_END_MARKER)
    except tarfile.TarError:
        return archive  # not a plain tar: the engine says what is wrong with it
    if end >= len(archive) or any(archive[end:]):
        return archive
    return archive[:end]


def exit_reporting_argv(argv: list[str], nonce: str) -> list[str]:
    """`argv` run by `sh`, which then writes `[rollstream-exit:NONCE:CODE]` to stderr."""
    report = f'"$@"; printf \'{EXIT_TRAILER.format(nonce=nonce)}%d]\' "$?" >&2'
    return ["sh", "-c", report, "sh", *argv]


class ExitTrailerSink:
    """Passes frames on, holding back the end of stderr until it is known not to be the trailer."""

    def __init__(self, sink: Callable[[int, bytes], None], nonce: str) -> None:
        self._sink = sink
        prefix = re.escape(EXIT_TRAILER.format(nonce=nonce).encode())
        self._trailer = re.compile(prefix + rb"(\d{1,10})\]\Z")
        self._hold = len(EXIT_TRAILER.format(nonce=nonce)) + 11  # the longest trailer
        self._held = bytearray()

    def add(self, stream: int, data: bytes) -> None:
        if stream != STDERR:
            self._sink(stream, data)
            return
        self._held.extend(data)
        if len(self._held) > self._hold:
            cut = len(self._held) - self._hold
            self._sink(STDERR, bytes(self._held[:cut]))
            del self._held[:cut]

    def finish(self) -> int | None:
        """The reported exit code (None without a trailer); passes on the held-back rest."""
        match = self._trailer.search(self._held)
        rest = self._held[: match.start()] if match else self._held
        if rest:
            self._sink(STDERR, bytes(rest))
        self._held = bytearray()
        return int(match.group(1)) if match else None


class DockerApi:
    """One connection pool to one Docker-compatible API."""

    def __init__(self, base_url: str, *, timeout_s: float, max_connections: int) -> None:
        self.base_url = base_url
        socket = unix_socket_path(base_url)
        if socket is not None and not Path(socket).exists():
            raise DockerUnreachableError(f"no docker API socket at {socket}")
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        transport = httpx.AsyncHTTPTransport(uds=socket, limits=limits) if socket else None
        self._client = httpx.AsyncClient(
            transport=transport, base_url=http_base(base_url), timeout=timeout_s, limits=limits
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._client.request(method, path, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout, FileNotFoundError) as error:
            raise DockerUnreachableError(f"docker API at {self.base_url} unreachable: {error}") from None
        except httpx.TimeoutException as error:
            raise DockerUnreachableError(f"docker API at {self.base_url} timed out: {error!r}") from None
        if response.status_code >= 400:
            raise DockerApiError(response.status_code, _error_message(response))
        return response

    async def ping(self) -> None:
        await self.request("GET", "/_ping")

    async def image_exists(self, image: str) -> bool:
        try:
            await self.request("GET", f"/images/{image}/json")
        except DockerApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def pull_image(self, image: str, timeout_s: float) -> None:
        """Pull `image`; the API reports failures inside a 200 progress stream."""
        if "@" in image:
            params = {"fromImage": image}
        elif ":" in image.split("/")[-1]:
            name, _, tag = image.rpartition(":")
            params = {"fromImage": name, "tag": tag}
        else:
            params = {"fromImage": image, "tag": "latest"}
        response = await self.request("POST", "/images/create", params=params, timeout=timeout_s)
        for line in response.text.splitlines():
            if line.strip() and "error" in (item := json.loads(line)):
                raise DockerApiError(500, str(item.get("error")))

    async def create_container(self, body: dict[str, Any], name: str | None = None) -> str:
        params = {"name": name} if name else None
        response = await self.request("POST", "/containers/create", json=body, params=params)
        return str(response.json()["Id"])

    async def start_container(self, container_id: str) -> None:
        await self.request("POST", f"/containers/{container_id}/start")

    async def inspect_container(self, container_id: str) -> dict[str, Any]:
        return dict((await self.request("GET", f"/containers/{container_id}/json")).json())

    async def remove_container(self, container_id: str) -> bool:
        """Force-remove; False when it was already gone."""
        try:
            await self.request("DELETE", f"/containers/{container_id}", params={"force": "true", "v": "true"})
        except DockerApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def list_containers(self, labels: list[str]) -> list[dict[str, Any]]:
        """Containers with all of `labels`. podman (4.3) fails a listing with 500 `container not
        known` when a container is removed while it lists: that is tried again."""
        filters = json.dumps({"label": labels})
        for attempt in range(LIST_ATTEMPTS):
            try:
                response = await self.request(
                    "GET", "/containers/json", params={"all": "true", "filters": filters}
                )
                return list(response.json())
            except DockerApiError as error:
                if error.status != 500 or "not known" not in error.message or attempt == LIST_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(0.1 * (attempt + 1))
        raise AssertionError("unreachable")

    async def ensure_network(self, name: str, labels: dict[str, str]) -> None:
        """Create an internal (no route out) network once; concurrent creators are fine."""
        try:
            await self.request("GET", f"/networks/{name}")
            return
        except DockerApiError as error:
            if error.status != 404:
                raise
        try:
            body = {"Name": name, "Internal": True, "CheckDuplicate": True, "Labels": labels}
            await self.request("POST", "/networks/create", json=body)
        except DockerApiError as error:
            if error.status != 409:
                raise

    async def exec_run(
        self,
        container_id: str,
        argv: list[str],
        *,
        env: list[str],
        workdir: str | None,
        output: OutputCollector,
        timeout_s: float,
    ) -> int | None:
        """Run `argv` in the container, feed its output to `output`, return its exit code."""
        nonce = uuid.uuid4().hex
        body: dict[str, Any] = {
            "Cmd": exit_reporting_argv(argv, nonce),
            "AttachStdout": True,
            "AttachStderr": True,
            "Env": env,
        }
        if workdir:
            body["WorkingDir"] = workdir
        exec_id = (await self.request("POST", f"/containers/{container_id}/exec", json=body)).json()["Id"]
        frames = ExitTrailerSink(output.add, nonce)
        timeout = httpx.Timeout(timeout_s, connect=30.0)
        try:
            async with self._client.stream(
                "POST", f"/exec/{exec_id}/start", json={"Detach": False, "Tty": False}, timeout=timeout
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise DockerApiError(response.status_code, _error_message(response))
                await demux_frames(response.aiter_raw(), frames.add)
        except httpx.TimeoutException as error:
            raise TimeoutError(f"exec {exec_id} sent nothing for {timeout_s:.0f}s") from error
        except (httpx.TransportError, FileNotFoundError) as error:
            raise DockerUnreachableError(f"docker API at {self.base_url} dropped exec: {error!r}") from None
        reported = frames.finish()
        if reported is not None:
            return reported
        info = (await self.request("GET", f"/exec/{exec_id}/json")).json()  # the wrapper died too
        code = info.get("ExitCode")
        return int(code) if code is not None else None

    async def container_logs(self, container_id: str, tail: int) -> str:
        """The last `tail` lines the container's PID 1 wrote (stdout and stderr together)."""
        params = {"stdout": "true", "stderr": "true", "tail": str(tail)}
        response = await self.request("GET", f"/containers/{container_id}/logs", params=params)
        pieces: list[bytes] = []

        async def body() -> AsyncIterator[bytes]:
            yield response.content

        await demux_frames(body(), lambda _stream, data: pieces.append(data))
        return b"".join(pieces).decode(errors="replace")

    async def put_archive(self, container_id: str, path: str, tar_bytes: bytes) -> None:
        await self.request(
            "PUT",
            f"/containers/{container_id}/archive",
            params={"path": path},
            content=tar_to_end_marker(tar_bytes),
        )

    async def get_archive(self, container_id: str, path: str, into: Path) -> None:
        """Stream the tar of `path` into the file `into`."""
        async with self._client.stream(
            "GET", f"/containers/{container_id}/archive", params={"path": path}
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                raise DockerApiError(response.status_code, _error_message(response))
            with into.open("wb") as handle:
                async for chunk in response.aiter_bytes():
                    handle.write(chunk)


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message", response.text))
    except (ValueError, AttributeError):
        return response.text[:500]
