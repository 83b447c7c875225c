"""The docker backend: one container per sandbox, over Docker's (or podman's) HTTP API.

Contract:
- Containers have no network of their own: `network_mode="none"` (default) or one shared
  internal network created once (`sandbox.docker.network="shared-internal"`), so the
  per-host network limit (~31 bridge networks) never applies.
- Every container carries labels: `<label>=1`, the run id, and its owner
  (host/pid/process start time). When a factory first connects it removes labelled
  containers whose owner process on this host is gone (leaks of crashed workers), and
  only those: other live workers' sandboxes are left alone.
- Limits come from `sandbox.limits`: memory (no swap), pids (the process cap),
  RLIMIT_CPU, and per command a wall-clock timeout run *inside* the container
  (`timeout -s KILL`, which kills the command's whole process group) plus a host-side
  deadline `exec_grace_s` later, past which the sandbox counts as not answering.
  Processes a command leaves running after it exits (`cmd &` with its output
  redirected) are kept, as with `docker exec`. On a timeout every process in the
  container but its init dies (`kill -9 -1`), `setsid` children included, as with
  the bwrap backend: nothing the agent started can keep running into the verifier.
  Output is kept up to `output_limit_bytes` (head and tail of each stream); the rest
  is read, counted and dropped.
- Images missing on the engine are pulled when `pull_missing`; every pull is counted
  (`factory.pulls`) and waits on the pool's gate when the pool set one
  (`set_pull_gate`, `PullGated`); without a pool the factory itself refuses pulls past
  `pool.image_pulls_per_h`.
- Warm pools: a sandbox started with no workspace takes one later (`attach_workspace`).
- Starts: a transient engine error (5xx, dropped connection) is tried again, up to
  `start_attempts` in all with a growing backoff; the retried start stays one start,
  timed from its first try, and every retry is counted (`factory.start_retries`,
  `timings.start_attempts`).
- Errors: no API → `BackendUnavailableError` (says how to start one); image missing or
  container refused → `SandboxStartError`; container gone → `SandboxLostError`; no answer
  within a command's deadline, or a paused container → `SandboxTimeoutError`. A failing
  command is an ExecResult.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from sandboxes.base import (
    BackendUnavailableError,
    ExecResult,
    PullGate,
    SandboxLostError,
    SandboxStartError,
    SandboxTimeoutError,
    Timings,
)
from sandboxes.docker_api import DockerApi, DockerApiError, DockerUnreachableError
from sandboxes.docker_images import ImageKeeper
from sandboxes.docker_owner import owner_is_gone, owner_label
from sandboxes.output import OutputCollector, exec_result, timeout_argv
from sandboxes.settings import SandboxSettings
from sandboxes.transfer import extract_download, tar_directory, tar_path

BACKEND = "docker"
RLIMIT_HINT = (
    "; the engine may not raise rlimits beyond its own (no CAP_SYS_RESOURCE, as under podman "
    "in a container): lower sandbox.docker.ulimit_nproc / ulimit_nofile below the engine's limits"
)
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/podman/podman.sock")
START_HINT = (
    "start podman's Docker-compatible API with `.venv/bin/python -m rollstream.launcher.podman up` "
    "(it prints the socket) and set sandbox.docker.base_url to it, or point it at a Docker engine"
)


def is_transient_start_error(error: DockerApiError | DockerUnreachableError) -> bool:
    """Worth another try: the engine failed inside (5xx) or the connection dropped; not a
    request it refused (4xx) nor an rlimit the engine cannot raise (fails every time)."""
    if isinstance(error, DockerUnreachableError):
        return True
    return error.status >= 500 and "rlimit" not in error.message


def resolve_base_url(configured: str) -> str:
    """The configured address, else DOCKER_HOST (Docker's own convention), else a default socket."""
    if configured:
        return configured
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    for path in DEFAULT_SOCKETS:
        if Path(path).exists():
            return f"unix://{path}"
    raise BackendUnavailableError(
        f"no docker API configured, none at {', '.join(DEFAULT_SOCKETS)}; {START_HINT}", backend=BACKEND
    )


class DockerSandboxFactory:
    """Makes docker sandboxes; connects, cleans leaks and prepares the network on first use."""

    backend = BACKEND

    def __init__(self, settings: SandboxSettings, *, run_id: str = "") -> None:
        if settings.docker.api_connections < settings.pool.max_running:
            raise ValueError(
                f"sandbox.docker.api_connections ({settings.docker.api_connections}) is below "
                f"sandbox.pool.max_running ({settings.pool.max_running}): every running exec holds one "
                "connection, so execs would queue on a hidden cap; raise api_connections"
            )
        self.settings = settings
        self.run_id = run_id
        self.owner = owner_label()
        self.images = ImageKeeper(settings)
        self.leaked_removed = 0
        self.start_retries = 0  # container starts tried again after a transient engine error
        self._api: DockerApi | None = None
        self._lock = asyncio.Lock()

    def create(self, workspace: Path | None, *, image: str | None = None) -> DockerSandbox:
        return DockerSandbox(self, workspace, image or self.settings.docker.image)

    def set_pull_gate(self, gate: PullGate) -> None:
        """The pool's `image_pulls_per_h` gate, awaited before every pull."""
        self.images.pull_gate = gate

    @property
    def pulls(self) -> int:
        """Image pulls started by this factory (failed ones too: registries count them)."""
        return self.images.pulls

    @property
    def labels(self) -> dict[str, str]:
        label = self.settings.docker.label
        return {label: "1", f"{label}.run": self.run_id, f"{label}.owner": self.owner}

    @property
    def connected_api(self) -> DockerApi | None:
        """The API once connected (sandboxes only exist after their factory connected)."""
        return self._api

    async def api(self) -> DockerApi:
        """The connected API; the first call also removes leaked containers and makes the network."""
        async with self._lock:
            if self._api is None:
                self._api = await self._connect()
            return self._api

    async def _connect(self) -> DockerApi:
        docker = self.settings.docker
        base_url = resolve_base_url(docker.base_url)
        try:
            api = DockerApi(base_url, timeout_s=docker.api_timeout_s, max_connections=docker.api_connections)
            await api.ping()
            await self._remove_leaked(api)
            if docker.network == "shared-internal":
                await api.ensure_network(docker.network_name, {docker.label: "1"})
        except (DockerUnreachableError, DockerApiError) as error:
            raise BackendUnavailableError(
                f"docker API at {base_url}: {error}; {START_HINT}", backend=BACKEND
            ) from None
        return api

    async def _remove_leaked(self, api: DockerApi) -> None:
        label = self.settings.docker.label
        for container in await api.list_containers([f"{label}=1"]):
            owner = (container.get("Labels") or {}).get(f"{label}.owner", "")
            if owner_is_gone(owner) and await api.remove_container(container["Id"]):
                self.leaked_removed += 1

    async def cleanup_leaked(self) -> int:
        """Remove leaked containers now (also done on first connect); returns how many in all."""
        await self._remove_leaked(await self.api())
        return self.leaked_removed

    async def ensure_image(self, image: str) -> None:
        """Make sure `image` is on the engine, pulling it (counted, capped, once) if allowed."""
        await self.images.ensure(await self.api(), image)

    def container_body(self, image: str) -> dict[str, Any]:
        docker, limits = self.settings.docker, self.settings.limits
        ulimits = [{"Name": "cpu", "Soft": limits.cpu_time_s, "Hard": limits.cpu_time_s}]
        for name, value in (("nofile", docker.ulimit_nofile), ("nproc", docker.ulimit_nproc)):
            if value > 0:
                ulimits.append({"Name": name, "Soft": value, "Hard": value})
        memory = limits.memory_mb * 1024 * 1024
        host_config: dict[str, Any] = {
            "NetworkMode": "none" if docker.network == "none" else docker.network_name,
            "Memory": memory,
            "MemorySwap": memory,
            "PidsLimit": limits.max_processes,
            "Ulimits": ulimits,
            "CapDrop": ["NET_RAW", "MKNOD", "AUDIT_WRITE"],
            "SecurityOpt": ["no-new-privileges"],
        }
        if docker.cpus > 0:
            host_config["NanoCpus"] = int(docker.cpus * 1e9)
        return {
            "Image": image,
            "Cmd": list(docker.keepalive),
            "WorkingDir": docker.workdir,
            "Labels": self.labels,
            "HostConfig": host_config,
        }

    async def aclose(self) -> None:
        if self._api is not None:
            await self._api.aclose()
            self._api = None


class DockerSandbox:
    """One container. `exec` runs `sh -c COMMAND` under `timeout -s KILL` in the workspace."""

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
        self._stopped = False

    async def start(self) -> None:
        """Create and start the container; a transient engine error is retried (counted in
        `timings.start_attempts` and `factory.start_retries`; `start_s` covers every try)."""
        began = time.monotonic()
        if self._workspace is not None and not self._workspace.is_dir():
            raise SandboxStartError(f"workspace {self._workspace} is not a directory", backend=BACKEND)
        await self._factory.ensure_image(self.image)
        api = await self._factory.api()
        attempts = self._docker.start_attempts
        for attempt in range(1, attempts + 1):
            self.timings.start_attempts = attempt
            try:
                await self._create_and_start(api, attempt)
                break
            except (DockerApiError, DockerUnreachableError) as error:
                await self._remove_quietly()
                self.container_id = ""
                if attempt < attempts and is_transient_start_error(error):
                    self._factory.start_retries += 1
                    await asyncio.sleep(self._docker.start_retry_backoff_s * attempt)
                    continue
                hint = RLIMIT_HINT if "rlimit" in str(error) else ""
                tries = f" (after {attempt} tries)" if attempt > 1 else ""
                raise SandboxStartError(
                    f"container for {self.image} did not start{tries}: {error}{hint}", backend=BACKEND
                ) from None
        self.timings.start_s = time.monotonic() - began

    async def _create_and_start(self, api: DockerApi, attempt: int) -> None:
        # A retry gets a new name: the failed try's container may not be gone yet.
        name = f"rollstream-{self.id}" if attempt == 1 else f"rollstream-{self.id}-{attempt}"
        self.container_id = await api.create_container(self._factory.container_body(self.image), name=name)
        await self._put_workspace(api, self._workspace)
        await api.start_container(self.container_id)

    async def attach_workspace(self, workspace: Path | None) -> None:
        """Give a sandbox started without a workspace (a warm one) its workspace now."""
        api = self._require_running()
        if workspace is not None and not workspace.is_dir():
            raise SandboxStartError(f"workspace {workspace} is not a directory", backend=BACKEND)
        try:
            await self._put_workspace(api, workspace)
        except (DockerApiError, DockerUnreachableError) as error:
            raise await self._lost(error) from None

    async def _put_workspace(self, api: DockerApi, workspace: Path | None) -> None:
        workspace_tar = await asyncio.to_thread(tar_directory, workspace, self._docker.workdir)
        await api.put_archive(self.container_id, "/", workspace_tar)

    async def exec(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        api = self._require_running()
        limit = timeout if timeout is not None else self._limits.command_timeout_s
        argv = timeout_argv(command, limit)
        env_list = [f"{key}={value}" for key, value in (env or {}).items()]
        output = OutputCollector(self._limits.output_limit_bytes)
        began = time.monotonic()
        code = await self._exec_within(
            api,
            argv,
            env=env_list,
            workdir=cwd or self._docker.workdir,
            output=output,
            deadline_s=limit + self._docker.exec_grace_s,
            doing=f"(command timeout {limit:.0f}s + exec_grace_s)",
        )
        duration = time.monotonic() - began
        self.timings.execs.append(duration)
        result = exec_result(code, output, duration, limit)
        if result.timed_out:
            await self._kill_all_but_init(api)
        return result

    async def _kill_all_but_init(self, api: DockerApi) -> None:
        """SIGKILL every process in the container except its init (and the killing shell)."""
        argv = ["sh", "-c", "kill -9 -1 2>/dev/null; true"]
        await self._exec_within(
            api,
            argv,
            env=[],
            workdir="/",
            output=OutputCollector(1024),
            deadline_s=self._docker.exec_grace_s,
            doing="while killing a timed-out command",
        )

    async def _exec_within(
        self,
        api: DockerApi,
        argv: list[str],
        *,
        env: list[str],
        workdir: str,
        output: OutputCollector,
        deadline_s: float,
        doing: str,
    ) -> int | None:
        """Run `argv` in the container; its exit code. Past `deadline_s` → `SandboxTimeoutError`
        (its message ends with `doing`); an engine error → lost (or paused)."""
        try:
            async with asyncio.timeout(deadline_s):
                return await api.exec_run(
                    self.container_id, argv, env=env, workdir=workdir, output=output, timeout_s=deadline_s
                )
        except TimeoutError as error:
            raise SandboxTimeoutError(
                f"sandbox {self.id} did not answer within {deadline_s:.0f}s {doing}", backend=BACKEND
            ) from error
        except (DockerApiError, DockerUnreachableError) as error:
            raise await self._lost(error) from None

    async def upload(self, local: Path, remote: str) -> None:
        api = self._require_running()
        target = self._absolute(remote)
        if not local.exists():
            raise FileNotFoundError(f"upload source {local} does not exist")
        data = await asyncio.to_thread(tar_path, local, target.lstrip("/"))
        try:
            await api.put_archive(self.container_id, "/", data)
        except (DockerApiError, DockerUnreachableError) as error:
            raise await self._lost(error) from None

    async def download(self, remote: str, local: Path) -> None:
        api = self._require_running()
        with tempfile.TemporaryDirectory(prefix="rollstream-dl-") as scratch:
            archive = Path(scratch) / "download.tar"
            try:
                await api.get_archive(self.container_id, self._absolute(remote), archive)
            except DockerApiError as error:
                if error.status == 404 and await self._is_running():
                    raise FileNotFoundError(f"{remote} does not exist in sandbox {self.id}") from None
                raise await self._lost(error) from None
            except DockerUnreachableError as error:
                raise await self._lost(error) from None
            await asyncio.to_thread(extract_download, archive, local, Path(scratch) / "out")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self._remove_quietly()

    async def freeze(self) -> None:
        """Pause the container (`sandbox.faults.hang_rate`): calls on it then time out into
        `SandboxTimeoutError` (a paused container answers nothing), as with a real hang."""
        await self._require_running().request("POST", f"/containers/{self.container_id}/pause")

    def _absolute(self, remote: str) -> str:
        return remote if remote.startswith("/") else f"{self._docker.workdir.rstrip('/')}/{remote}"

    def _require_running(self) -> DockerApi:
        api = self._factory.connected_api
        if self._stopped or not self.container_id or api is None:
            raise SandboxLostError(
                f"sandbox {self.id} is not running (never started or stopped)", backend=BACKEND
            )
        return api

    async def _state(self) -> str:
        """`running`, `paused` (frozen: answers nothing) or `gone`."""
        try:
            info = await self._require_running().inspect_container(self.container_id)
        except (DockerApiError, DockerUnreachableError, SandboxLostError):
            return "gone"
        state = info.get("State", {})
        return "paused" if state.get("Paused") else "running" if state.get("Running") else "gone"

    async def _is_running(self) -> bool:
        return await self._state() == "running"

    async def _lost(self, error: Exception) -> SandboxLostError | SandboxTimeoutError:
        state = await self._state()
        if state == "paused":
            message = f"sandbox {self.id} is paused and answers nothing: {error}"
            return SandboxTimeoutError(message, backend=BACKEND)
        return SandboxLostError(f"sandbox {self.id} ({state}): {error}", backend=BACKEND)

    async def _remove_quietly(self) -> None:
        api = self._factory.connected_api
        if not self.container_id or api is None:
            return
        # An engine that is gone took the container with it; other leaks are cleaned at next start.
        with contextlib.suppress(DockerApiError, DockerUnreachableError):
            await api.remove_container(self.container_id)
