"""How a docker sandbox's commands and files reach its container: one protocol, two channels.

- `HelperChannel` (`sandboxes/docker_helper_channel.py`, `sandbox.docker.channel = "helper"`,
  the default): our exec helper runs as the container's PID 1 and serves commands and
  files over a Unix socket; a command costs one round trip, not an engine call.
- `EngineChannel` (here, `"engine"`): each command is an engine exec (two API calls and a
  `runc exec`), files go through the engine's archive endpoints. It works with an engine
  on another host, where no directory can be shared with the container; about ten times
  the cost of a command through the helper.

Both report failures with the same three errors, which the sandbox turns into typed
sandbox errors after asking the engine what became of the container: `ChannelGone` (the
container or its helper is gone, or the engine failed), `ChannelSilent` (no answer within
the deadline), `ChannelRefused` (a request the container could not do: a missing path).
"""

from __future__ import annotations

import asyncio
import errno
import time
from pathlib import Path
from typing import Any, Protocol

from sandboxes.base import ExecResult
from sandboxes.docker_api import DockerApi, DockerApiError, DockerUnreachableError
from sandboxes.output import OutputCollector, exec_result, timeout_argv
from sandboxes.settings import SandboxSettings


class ChannelError(Exception):
    """The channel failed; the sandbox decides what kind of sandbox error it is."""


class ChannelGone(ChannelError):
    """The container, its helper or the engine is gone."""


class ChannelSilent(ChannelError):
    """No answer within the deadline."""


class ChannelRefused(ChannelError):
    """The request could not be done in the container (`errno` as on Linux, 0 when unknown)."""

    def __init__(self, message: str, error_number: int) -> None:
        super().__init__(message)
        self.errno = error_number


class Channel(Protocol):
    """Commands and files into one container."""

    def container_changes(self) -> dict[str, Any]:
        """Fields merged into the container's create body (its command, its mounts)."""
        ...

    async def prepare(self) -> None:
        """Before the container is created."""
        ...

    async def open(self, container_id: str) -> None:
        """After the container started; raises when it cannot serve."""
        ...

    async def exec(self, command: str, *, timeout_s: float, cwd: str, env: dict[str, str]) -> ExecResult: ...

    async def put(self, archive: bytes) -> None:
        """Extract a tar archive at `/` (its members name absolute paths without the `/`)."""
        ...

    async def get(self, path: str, into: Path) -> None:
        """Write a tar archive of `path` (file or directory, under its base name) to `into`."""
        ...

    async def close(self) -> None: ...

    def diagnosis(self) -> str:
        """What the channel knows about why it failed ('' when nothing)."""
        ...


class EngineChannel:
    """Each command an engine exec under `timeout -s KILL`; files through the archive endpoints."""

    def __init__(self, api: DockerApi, settings: SandboxSettings) -> None:
        self._api = api
        self._docker = settings.docker
        self._limits = settings.limits
        self._container = ""

    def container_changes(self) -> dict[str, Any]:
        return {"Cmd": list(self._docker.keepalive)}

    async def prepare(self) -> None:
        return None

    async def open(self, container_id: str) -> None:
        self._container = container_id

    async def exec(self, command: str, *, timeout_s: float, cwd: str, env: dict[str, str]) -> ExecResult:
        output = OutputCollector(self._limits.output_limit_bytes)
        env_list = [f"{key}={value}" for key, value in env.items()]
        argv = timeout_argv(command, timeout_s)
        code, duration = await self._run(argv, env_list, cwd, output, timeout_s + self._docker.exec_grace_s)
        result = exec_result(code, output, duration, timeout_s)
        if result.timed_out:  # every process but init, `setsid` children too
            await self._run(
                ["sh", "-c", "kill -9 -1 2>/dev/null; true"], [], "/", OutputCollector(1024), 30.0
            )
        return result

    async def _run(
        self, argv: list[str], env: list[str], cwd: str, output: OutputCollector, deadline_s: float
    ) -> tuple[int | None, float]:
        began = time.monotonic()
        try:
            async with asyncio.timeout(deadline_s):
                code = await self._api.exec_run(
                    self._container, argv, env=env, workdir=cwd, output=output, timeout_s=deadline_s
                )
        except TimeoutError:
            raise ChannelSilent(f"no answer from the engine's exec within {deadline_s:.0f}s") from None
        except (DockerApiError, DockerUnreachableError) as error:
            raise ChannelGone(str(error)) from None
        return code, time.monotonic() - began

    async def put(self, archive: bytes) -> None:
        try:
            await self._api.put_archive(self._container, "/", archive)
        except (DockerApiError, DockerUnreachableError) as error:
            raise ChannelGone(str(error)) from None

    async def get(self, path: str, into: Path) -> None:
        try:
            await self._api.get_archive(self._container, path, into)
        except DockerApiError as error:
            if error.status == 404:
                raise ChannelRefused(f"{path}: {error.message}", errno.ENOENT) from None
            raise ChannelGone(str(error)) from None
        except DockerUnreachableError as error:
            raise ChannelGone(str(error)) from None

    async def close(self) -> None:
        return None

    def diagnosis(self) -> str:
        return ""
