"""One docker sandbox: a container and the channel its commands and files take.

The contract (limits, errors, labels, retries) is in `sandboxes/docker.py`; the channels
in `sandboxes/docker_channel.py`. A start prepares the channel (the helper's socket),
creates and starts the container under the factory's engine cap, opens the channel
(the helper's hello) and puts the workspace in; a warm sandbox (started with no
workspace) takes its workspace later (`attach_workspace`), through the channel only,
so a handoff costs no engine call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import tempfile
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sandboxes.base import ExecResult, SandboxLostError, SandboxStartError, SandboxTimeoutError, Timings
from sandboxes.docker_api import DockerApi, DockerApiError, DockerUnreachableError
from sandboxes.docker_channel import Channel, ChannelError, ChannelRefused, ChannelSilent
from sandboxes.transfer import extract_download, pack_tree
from sandboxes.workspace import count_entries

if TYPE_CHECKING:
    from sandboxes.docker import DockerSandboxFactory

BACKEND = "docker"
REMOVE_ATTEMPTS = 3
log = logging.getLogger(__name__)
RLIMIT_HINT = (
    "; the engine may not raise rlimits beyond its own (no CAP_SYS_RESOURCE, as under podman "
    "in a container): lower sandbox.docker.ulimit_nproc / ulimit_nofile below the engine's limits"
)


async def finish_despite_cancel(work: Coroutine[Any, Any, None]) -> None:
    """Run `work` to its end even if the caller is cancelled meanwhile, then pass the cancel on.

    A container create or start cut off on our side goes on in the engine; a removal sent
    meanwhile raced it, and podman (4.3) was left with a container it lists but cannot
    find ("container not known"), failing every later listing. So the create and start are
    waited for, and the container they made is then removed by its id.
    """
    task = asyncio.ensure_future(work)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await task
        raise


def is_transient_start_error(error: DockerApiError | DockerUnreachableError) -> bool:
    """Worth another try: the engine failed inside (5xx) or the connection dropped; not a
    request it refused (4xx) nor an rlimit the engine cannot raise (fails every time)."""
    if isinstance(error, DockerUnreachableError):
        return True
    return error.status >= 500 and "rlimit" not in error.message


class DockerSandbox:
    """One container. `exec` runs `sh -c COMMAND` in the workspace (see `sandboxes/docker.py`)."""

    backend = BACKEND

    def __init__(self, factory: DockerSandboxFactory, workspace: Path | None, image: str) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.timings = Timings()
        self.image = image
        self.container_id = ""
        self._factory = factory
        self._workspace = workspace
        self._docker = factory.settings.docker
        self._limits = factory.settings.limits
        self._channel: Channel | None = None
        self._stopped = False
        self._engine_wait_s = 0.0  # waits for the engine cap during start
        self._discarding: asyncio.Future[None] | None = None

    async def start(self) -> None:
        """Create and start the container; a transient engine error is retried (counted in
        `timings.start_attempts` and `factory.start_retries`; `start_s` covers every try)."""
        began = time.monotonic()
        self._check_workspace(self._workspace)
        await self._factory.ensure_image(self.image)
        api = await self._factory.api()
        attempts = self._docker.start_attempts
        for attempt in range(1, attempts + 1):
            self.timings.start_attempts = attempt
            try:
                await self._create_and_start(api, attempt)
                break
            except (DockerApiError, DockerUnreachableError, ChannelError) as error:
                why = await self._start_failure(error)
                await self._discard()
                self.container_id = ""
                transient = isinstance(error, DockerApiError | DockerUnreachableError)
                if attempt < attempts and transient and is_transient_start_error(error):
                    self._factory.start_retries += 1
                    await asyncio.sleep(self._docker.start_retry_backoff_s * attempt)
                    continue
                hint = RLIMIT_HINT if "rlimit" in why else ""
                tries = f" (after {attempt} tries)" if attempt > 1 else ""
                raise SandboxStartError(
                    f"container for {self.image} did not start{tries}: {why}{hint}", backend=BACKEND
                ) from None
            except BaseException:  # cancelled (the pool's start timeout): leave nothing behind
                await self._discard()
                raise
        self.timings.start_s = time.monotonic() - began - self._engine_wait_s

    async def _create_and_start(self, api: DockerApi, attempt: int) -> None:
        # A retry gets a new name: the failed try's container may not be gone yet.
        name = f"rollstream-{self.id}" if attempt == 1 else f"rollstream-{self.id}-{attempt}"
        self._channel = self._factory.channel_for(self.id, self._state)
        await self._channel.prepare()
        body = self._factory.sandbox_body(self.image, self._channel.container_changes())
        async with self._factory.engine_slot() as waited:
            self._engine_wait_s += waited  # queueing, not starting: the pool counts it as queue wait
            await finish_despite_cancel(self._create_container(api, body, name))
        await self._channel.open(self.container_id)
        await self._channel.put(await self._packed(self._workspace, self._docker.workdir.strip("/")))

    async def _create_container(self, api: DockerApi, body: dict[str, Any], name: str) -> None:
        self.container_id = await api.create_container(body, name=name)
        await api.start_container(self.container_id)

    async def _start_failure(self, error: Exception) -> str:
        """The error, with what the container's own output says when it ran at all."""
        if not self.container_id or isinstance(error, DockerApiError | DockerUnreachableError):
            return str(error)
        return f"{error}{await self._container_report()}"

    async def attach_workspace(self, workspace: Path | None) -> None:
        """Give a sandbox started without a workspace (a warm one) its workspace now."""
        channel = self._require_running()
        self._check_workspace(workspace)
        archive = await self._packed(workspace, self._docker.workdir.strip("/"))
        try:
            await channel.put(archive)
        except ChannelError as error:
            raise await self._typed(error, "while taking its workspace") from None

    async def exec(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        channel = self._require_running()
        limit = timeout if timeout is not None else self._limits.command_timeout_s
        if limit <= 0:
            raise ValueError(f"command timeout must be positive, got {limit}")
        began = time.monotonic()
        try:
            result = await channel.exec(
                command, timeout_s=limit, cwd=self._absolute(cwd or self._docker.workdir), env=env or {}
            )
        except ChannelError as error:
            raise await self._typed(
                error, f"within its command timeout ({limit:.0f}s) + exec_grace_s"
            ) from None
        self.timings.execs.append(time.monotonic() - began)
        return result

    async def upload(self, local: Path, remote: str) -> None:
        channel = self._require_running()
        target = self._absolute(remote)
        if not local.exists():
            raise FileNotFoundError(f"upload source {local} does not exist")
        archive = await self._packed(local, target.lstrip("/"))
        try:
            await channel.put(archive)
        except ChannelError as error:
            raise await self._typed(error, f"while taking {remote}") from None

    async def download(self, remote: str, local: Path) -> None:
        channel = self._require_running()
        with tempfile.TemporaryDirectory(prefix="rollstream-dl-") as scratch:
            archive = Path(scratch) / "download.tar"
            try:
                await channel.get(self._absolute(remote), archive)
            except ChannelError as error:
                raise await self._typed(error, f"while sending {remote}") from None
            await asyncio.to_thread(extract_download, archive, local, Path(scratch) / "out")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self._discard()

    async def freeze(self) -> None:
        """Pause the container (`sandbox.faults.hang_rate`): calls on it then wait out their
        deadlines into `SandboxTimeoutError` (a paused container answers nothing), as with a real hang."""
        self._require_running()
        api = await self._factory.api()
        await api.request("POST", f"/containers/{self.container_id}/pause")

    def _check_workspace(self, workspace: Path | None) -> None:
        if workspace is not None and not workspace.is_dir():
            raise SandboxStartError(f"workspace {workspace} is not a directory", backend=BACKEND)

    async def _packed(self, source: Path | None, name: str) -> bytes:
        """A tar of `source` named `name`: small trees on the event loop (threads convoy on the GIL
        under load), large ones on a thread."""
        limit = self._docker.inline_tar_max_entries
        if source is None or not source.is_dir() or count_entries(source, limit + 1) <= limit:
            return pack_tree(source, name)
        return await asyncio.to_thread(pack_tree, source, name)

    def _absolute(self, remote: str) -> str:
        return remote if remote.startswith("/") else f"{self._docker.workdir.rstrip('/')}/{remote}"

    def _require_running(self) -> Channel:
        if self._stopped or not self.container_id or self._channel is None:
            raise SandboxLostError(
                f"sandbox {self.id} is not running (never started or stopped)", backend=BACKEND
            )
        return self._channel

    async def _state(self) -> str:
        """The container's state: `running`, `paused` (frozen: answers nothing), `exited`, ... or `gone`."""
        api = self._factory.connected_api
        if api is None or not self.container_id:
            return "gone"
        try:
            info = await api.inspect_container(self.container_id)
        except (DockerApiError, DockerUnreachableError):
            return "gone"
        state = info.get("State", {})
        if state.get("Paused"):
            return "paused"
        return "running" if state.get("Running") else str(state.get("Status") or "stopped")

    async def _container_report(self) -> str:
        """How the container ended and the last lines its helper wrote ('' when unknown)."""
        api = self._factory.connected_api
        if api is None or not self.container_id:
            return ""
        try:
            state = (await api.inspect_container(self.container_id)).get("State", {})
            logs = await api.container_logs(self.container_id, tail=10)
        except (DockerApiError, DockerUnreachableError):
            return ""
        oom = ", OOM killed" if state.get("OOMKilled") else ""
        said = f"; it wrote: {logs.strip()[-500:]}" if logs.strip() else ""
        return f" [container {state.get('Status', '?')}, exit code {state.get('ExitCode', '?')}{oom}{said}]"

    async def _typed(self, error: ChannelError, doing: str) -> Exception:
        """The sandbox error (or a caller's file error) a channel failure amounts to."""
        state = await self._state()
        if isinstance(error, ChannelRefused) and state == "running":
            if error.errno == errno.ENOENT:
                return FileNotFoundError(f"sandbox {self.id}: {error}")
            return OSError(f"sandbox {self.id}: {error}")
        if state == "paused":
            return SandboxTimeoutError(
                f"sandbox {self.id} is paused and answers nothing: {error}", backend=BACKEND
            )
        if isinstance(error, ChannelSilent) and state == "running":
            return SandboxTimeoutError(f"sandbox {self.id} did not answer {doing}: {error}", backend=BACKEND)
        report = await self._container_report() if state != "gone" else ""
        return SandboxLostError(f"sandbox {self.id} ({state}) lost {doing}: {error}{report}", backend=BACKEND)

    async def _discard(self) -> None:
        """Remove the container, then close the channel. One discard at a time: a stop that comes
        while a cancelled start's discard runs waits for that one (shielded from the cancel)."""
        if self._discarding is None:
            channel, target = self._channel, self.container_id
            self._channel = None
            self._discarding = asyncio.ensure_future(self._remove_and_close(target, channel))
        discarding = self._discarding
        try:
            await asyncio.shield(discarding)
        finally:
            if discarding.done() and self._discarding is discarding:
                self._discarding = None  # a retried start discards its next container afresh

    async def _remove_and_close(self, target: str, channel: Channel | None) -> None:
        """A removal the engine fails is tried again (`REMOVE_ATTEMPTS`); an engine that is gone
        took the container with it, and what is left is removed by the next factory's leak
        cleanup once this process is gone."""
        api = self._factory.connected_api
        if target and api is not None:
            async with self._factory.engine_slot():
                for attempt in range(1, REMOVE_ATTEMPTS + 1):
                    try:
                        await api.remove_container(target)
                        break
                    except (DockerApiError, DockerUnreachableError) as error:
                        if attempt == REMOVE_ATTEMPTS:
                            log.warning("container %s of sandbox %s not removed: %s", target, self.id, error)
                        else:
                            await asyncio.sleep(0.2 * attempt)
        if channel is not None:
            await channel.close()
