"""The docker backend: one container per sandbox, over Docker's (or podman's) HTTP API.

Contract:
- Commands and files: by default through our exec helper (`sandboxes/helper/`, a static
  C binary built from source, bind-mounted read-only and run as the container's PID 1),
  over a Unix socket in a directory bind-mounted into that one container: a command is
  one round trip, not an engine exec, and the image needs no Python, no coreutils, no
  libc. `sandbox.docker.channel = "engine"` uses engine execs instead (for an engine on
  another host). See `sandboxes/docker_channel.py` and `sandboxes/docker_helper_channel.py`.
- Containers have no network of their own: `network_mode="none"` (default) or one shared
  internal network created once (`sandbox.docker.network="shared-internal"`), so the
  per-host network limit (~31 bridge networks) never applies. No port is ever opened.
- Every container carries labels: `<label>=1`, the run id, and its owner
  (host/pid/process start time). When a factory first connects it removes labelled
  containers whose owner process on this host is gone (leaks of crashed workers), and
  only those: other live workers' sandboxes are left alone. Helper socket directories
  left by dead processes are removed too.
- Limits come from `sandbox.limits`: memory (no swap), pids (the process cap),
  RLIMIT_CPU, and per command a wall-clock timeout after which every process in the
  container but its PID 1 dies (`kill(-1, SIGKILL)`), `setsid` children included, as
  with the bwrap backend: nothing the agent started can keep running into the verifier;
  a host-side deadline `exec_grace_s` later counts the sandbox as not answering.
  Processes a command leaves running after it exits (`cmd &` with its output
  redirected) are kept, as with `docker exec`. Output is kept up to
  `output_limit_bytes` (head and tail of each stream); the rest is read, counted and dropped.
- Images missing on the engine are pulled when `pull_missing`; every pull is counted
  (`factory.pulls`) and waits on the pool's gate when the pool set one
  (`set_pull_gate`, `PullGated`); without a pool the factory itself refuses pulls past
  `pool.image_pulls_per_h`.
- The engine's concurrency cap: container creates+starts and removals in flight are
  capped at `engine_concurrency` (cap `container_engine`); the waits are reported to the pool
  (`set_wait_recorder`), so a cold start that queues behind the engine says so on
  `sandbox.ready`'s `cap_waits`, and they count as queue wait, not start time.
- Warm pools: a sandbox started with no workspace takes one later (`attach_workspace`),
  through the channel: a handoff costs no engine call.
- Starts: a transient engine error (5xx, dropped connection) is tried again, up to
  `start_attempts` in all with a growing backoff; the retried start stays one start,
  timed from its first try, and every retry is counted (`factory.start_retries`,
  `timings.start_attempts`).
- Errors: no API → `BackendUnavailableError` (says how to start one); image missing,
  container refused or helper not coming up → `SandboxStartError`; container or helper
  gone → `SandboxLostError` (with the container's exit code and last words); no answer
  within a command's deadline, or a paused container → `SandboxTimeoutError`. A failing
  command is an ExecResult.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sandboxes.base import BackendUnavailableError, PullGate
from sandboxes.docker_api import DockerApi, DockerApiError, DockerUnreachableError, unix_socket_path
from sandboxes.docker_channel import Channel, EngineChannel
from sandboxes.docker_helper import helper_binary
from sandboxes.docker_helper_channel import HelperChannel, new_channel_dir
from sandboxes.docker_images import ImageKeeper
from sandboxes.docker_owner import owner_is_gone, owner_label
from sandboxes.docker_sandbox import DockerSandbox, is_transient_start_error
from sandboxes.settings import SandboxSettings
from sandboxes.workspace import remove_stale_workspaces

__all__ = ["DockerSandbox", "DockerSandboxFactory", "is_transient_start_error", "resolve_base_url"]

BACKEND = "docker"
ENGINE_CAP = "container_engine"
DEFAULT_SOCKETS = ("/var/run/docker.sock", "/run/podman/podman.sock")
START_HINT = (
    "start podman's Docker-compatible API with `.venv/bin/python -m rollstream.launcher.podman up` "
    "(it prints the socket) and set sandbox.docker.base_url to it, or point it at a Docker engine"
)
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
WaitRecorder = Callable[[str, float], None]


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


def require_local_engine(base_url: str) -> None:
    """The helper channel bind-mounts host directories: the engine must run on this host."""
    if unix_socket_path(base_url) is not None:
        return
    host = urlsplit(base_url.replace("tcp://", "http://")).hostname or ""
    if host not in LOCAL_HOSTS:
        raise BackendUnavailableError(
            f"sandbox.docker.channel = 'helper' bind-mounts directories of this host into each container, "
            f"so the engine must run here, not at {base_url}; set sandbox.docker.channel = 'engine' for a "
            "remote engine (an engine exec per command)",
            backend=BACKEND,
        )


def default_channel_root() -> Path:
    return Path(tempfile.gettempdir()) / f"rollstream-docker-{os.getuid()}"


class DockerSandboxFactory:
    """Makes docker sandboxes; on first use connects, cleans leaks, builds the helper, makes the network."""

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
        docker = settings.docker
        self.channel_root = Path(docker.channel_root) if docker.channel_root else default_channel_root()
        self._helper: Path | None = None
        self._api: DockerApi | None = None
        self._lock = asyncio.Lock()
        self._engine_gate = asyncio.Semaphore(docker.engine_concurrency)
        self._record_wait: WaitRecorder | None = None

    def create(self, workspace: Path | None, *, image: str | None = None) -> DockerSandbox:
        return DockerSandbox(self, workspace, image or self.settings.docker.image)

    def create_for_image(self, workspace: Path | None, image: str) -> DockerSandbox:
        return self.create(workspace, image=image)

    def set_pull_gate(self, gate: PullGate) -> None:
        """The pool's `image_pulls_per_h` gate, awaited before every pull."""
        self.images.pull_gate = gate

    def set_wait_recorder(self, record: WaitRecorder) -> None:
        """Where waits on the engine cap are reported (the pool's cap bookkeeping)."""
        self._record_wait = record

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
        """The connected API; the first call also removes leaks, builds the helper and makes the network."""
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
        if docker.channel == "helper":
            require_local_engine(base_url)
            self._helper = await asyncio.to_thread(helper_binary, docker)
            await asyncio.to_thread(remove_stale_workspaces, self.channel_root)
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

    @contextlib.asynccontextmanager
    async def engine_slot(self) -> AsyncIterator[float]:
        """Hold one of the `engine_concurrency` slots; yields the seconds waited for it, which are
        reported as cap `container_engine`."""
        waited = 0.0
        if self._engine_gate.locked():
            began = time.monotonic()
            await self._engine_gate.acquire()
            waited = time.monotonic() - began
            if self._record_wait is not None:
                self._record_wait(ENGINE_CAP, waited)
        else:
            await self._engine_gate.acquire()
        try:
            yield waited
        finally:
            self._engine_gate.release()

    def channel_for(self, sandbox_id: str, state: Callable[[], Awaitable[str]]) -> Channel:
        """A new channel for one sandbox (call after `api()`)."""
        assert self._api is not None
        if self.settings.docker.channel == "engine":
            return EngineChannel(self._api, self.settings)
        assert self._helper is not None
        return HelperChannel(
            self.settings, self._helper, new_channel_dir(self.channel_root, sandbox_id), state
        )

    def container_body(self, image: str) -> dict[str, Any]:
        """A sandbox container whose PID 1 keeps it up (`keepalive`); `sandbox_body` adds the channel."""
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

    def sandbox_body(self, image: str, changes: dict[str, Any]) -> dict[str, Any]:
        """`container_body` with a channel's changes (its PID 1 command, its bind mounts) and,
        for the default image through the helper, the workspace in memory (`workspace_in_memory`)."""
        docker = self.settings.docker
        body, changes = self.container_body(image), dict(changes)
        binds = changes.pop("Binds", None)
        body.update(changes)
        if binds:
            body["HostConfig"]["Binds"] = binds
        if docker.workspace_in_memory and docker.channel == "helper" and image == docker.image:
            size = self.settings.limits.memory_mb  # the cgroup caps it anyway: tmpfs pages are charged to it
            body["HostConfig"]["Tmpfs"] = {docker.workdir: f"rw,exec,nosuid,nodev,size={size}m,mode=755"}
        return body

    async def aclose(self) -> None:
        if self._api is not None:
            await self._api.aclose()
            self._api = None
