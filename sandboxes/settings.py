"""Settings of the sandboxes layer: backend, limits, pool caps, tasks.

Every cap is a named setting; the pool records how long callers wait on each.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LimitSettings(Frozen):
    """Per-command and per-sandbox resource limits."""

    command_timeout_s: float = 180.0
    cpu_time_s: int = 600
    memory_mb: int = 2048
    max_processes: int = 256
    output_limit_bytes: int = Field(default=1_000_000, description="output kept per command (head + tail)")
    output_drain_s: float = Field(default=0.2, description="read output this long after the command exits")
    file_size_mb: int = Field(default=1024, description="largest file a command may write")
    tmpfs_mb: int = Field(default=512, description="size of the sandbox's /tmp")


class PoolSettings(Frozen):
    max_running: int = Field(default=512, description="sandboxes alive at once, per backend")
    max_starting: int = Field(default=64, description="starts in flight")
    starts_per_s: float = Field(default=0.0, description="0 = unlimited")
    image_pulls_per_h: int = Field(default=100, description="docker: pulls allowed per hour")
    warm_pool: int = Field(default=0, description="sandboxes started ahead for the next episodes")
    warm_starting: int = Field(default=8, description="warm refills in flight (so handoffs keep the CPU)")
    warm_images: int = Field(
        default=4,
        ge=0,
        description="images besides the default kept warm (warm_pool each), most recently asked",
    )
    start_timeout_s: float = 60.0


class BwrapSettings(Frozen):
    """The bubblewrap backend: paths and the dedicated uids commands run as."""

    bwrap_path: str = "bwrap"
    work_root: str = Field(default="", description="per-sandbox workspaces; empty = /dev/shm, else tmp")
    workspace_mount: str = Field(default="/workspace", description="where the workspace appears inside")
    uid_base: int = Field(default=200_000, description="first host uid of the per-sandbox uid range")
    uid_count: int = Field(default=60_000, description="uids in the range (>= pool.max_running)")
    bind_python: bool = Field(default=True, description="bind the running Python (with its venv) read-only")
    ro_paths: tuple[str, ...] = Field(default=(), description="extra host paths bound read-only")
    etc_paths: tuple[str, ...] = (
        "/etc/alternatives",
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/localtime",
        "/etc/nsswitch.conf",
        "/etc/passwd",
        "/etc/group",
        "/etc/ssl",
        "/etc/gitconfig",
    )
    server_grace_s: float = Field(default=10.0, description="extra wait for the exec server past a timeout")
    stop_timeout_s: float = Field(default=10.0, description="wait for a killed sandbox, then reap it later")
    copy_threads: int = Field(default=4, description="threads copying large workspaces")
    inline_copy_max_entries: int = Field(default=500, description="workspaces this small are copied inline")


class DockerSettings(Frozen):
    """The docker backend (Docker or podman's Docker-compatible API) and its image."""

    base_url: str = Field(default="", description="docker API socket; empty = DOCKER_HOST or podman's")
    image: str = "rollstream-sandbox:latest"
    network: Literal["none", "shared-internal"] = "none"
    network_name: str = Field(default="rollstream-internal", description="the one shared internal network")
    label: str = "rollstream.sandbox"
    workdir: str = Field(default="/workspace", description="where the workspace appears inside")
    channel: Literal["helper", "engine"] = Field(
        default="helper",
        description="how commands reach a container: 'helper' = our exec helper as its PID 1, over a Unix "
        "socket in a bind-mounted directory (the engine must run on this host); 'engine' = an engine exec "
        "per command (any engine, also a remote one; ~10x the cost per command)",
    )
    helper_path: str = Field(
        default="", description="a prebuilt exec helper; empty = build from sandboxes/helper"
    )
    helper_dir: str = Field(
        default="", description="where helpers are built; empty = ~/.cache/rollstream/helper"
    )
    channel_root: str = Field(
        default="",
        description="host dir of the per-sandbox helper sockets; empty = <tmp>/rollstream-docker-<uid>",
    )
    helper_ready_timeout_s: float = Field(default=30.0, gt=0, description="wait for a started helper's hello")
    engine_concurrency: int = Field(
        default=4,
        ge=1,
        description="container creates+starts and removals in flight at the engine (cap 'container_engine'): "
        "warm refills and cold starts queue here, so the engine is not swamped into slower starts",
    )
    workspace_in_memory: bool = Field(
        default=True,
        description="the default image's workdir is a tmpfs (counted in limits.memory_mb), as bwrap keeps "
        "workspaces in /dev/shm: on a loaded disk each file a handoff unpacks costs ~1 ms; images asked "
        "for per task keep what they have at workdir; channel = 'helper' only",
    )
    inline_tar_max_entries: int = Field(
        default=500, description="workspaces this small are packed on the event loop, larger ones on a thread"
    )
    keepalive: tuple[str, ...] = Field(
        default=("sh", "-c", "trap 'exit 0' TERM; while :; do sleep 3600 & wait; done"),
        description="PID 1 of each container with channel = 'engine': stays up and reaps orphaned processes",
    )
    pull_missing: bool = Field(default=True, description="pull an image that is not there (counted, capped)")
    pull_timeout_s: float = 600.0
    api_timeout_s: float = Field(default=60.0, description="per API call (not per command)")
    api_connections: int = Field(
        default=1024, description="HTTP connections to the API; a running exec holds one (>= max_running)"
    )
    exec_grace_s: float = Field(default=30.0, description="wait past a command's timeout before giving up")
    start_attempts: int = Field(
        default=3, ge=1, description="tries per container start on a transient engine error (5xx, dropped)"
    )
    start_retry_backoff_s: float = Field(
        default=0.5, ge=0.0, description="wait before a start's next try, times the tries so far"
    )
    ulimit_nofile: int = Field(default=4096, description="open files per process (0 = engine default)")
    ulimit_nproc: int = Field(
        default=16384, description="RLIMIT_NPROC (0 = engine default); pids_limit is the real process cap"
    )
    cpus: float = Field(default=0.0, description="CPU share per container; 0 = unlimited")
    debian_suite: str = Field(default="bookworm", description="image build: Debian release")
    debian_mirror: str = "http://deb.debian.org/debian"
    image_packages: tuple[str, ...] = ("python3", "python3-pytest")


class E2BSettings(Frozen):
    """The e2b backend (E2B's cloud microVMs). The key is read from the environment only."""

    template: str = "base"
    timeout_s: int = Field(default=3600, description="sandbox lifetime in E2B's cloud")
    request_timeout_s: float = 30.0
    api_key_env: str = Field(default="E2B_API_KEY", description="environment variable holding the key")
    domain: str = Field(default="", description="E2B domain (self-hosted); empty = the SDK's default")
    workdir: str = Field(default="/home/user/workspace", description="where the workspace appears inside")
    allow_internet_access: bool = Field(default=False, description="sandboxes get no network by default")
    exec_grace_s: float = Field(default=30.0, description="wait past a command's timeout before giving up")
    user: str = Field(
        default="user",
        description="the VM user commands and file transfers run as; after a command times out every "
        "process of this user dies (`kill -9 -1` as it), so it must not be root",
    )

    @field_validator("user")
    @classmethod
    def _not_root(cls, user: str) -> str:
        if not user.strip() or user.strip() == "root":
            raise ValueError(
                f"sandbox.e2b.user={user!r}: commands must run as an unprivileged user (E2B's default is "
                "'user'); as root, the timeout cleanup `kill -9 -1` would also kill E2B's envd"
            )
        return user.strip()


class SandboxFaultSettings(Frozen):
    """Faults injected into the real backend (`sandboxes/faults.py`); all 0 = off, the default."""

    start_failure_rate: float = Field(
        default=0.0, ge=0.0, le=1.0, description="fraction of sandbox starts that fail (sandbox_start)"
    )
    hang_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="fraction of starts and of execs that never return: a start is ended by "
        "pool.start_timeout_s, an exec (the sandbox frozen in place) by the backend's own handling "
        "(bwrap: command timeout + server_grace_s; docker: a paused container's exec fails as a "
        "timeout); bwrap and docker only",
    )
    seed: int = Field(default=0, description="seed of the fault draws: the same calls get the same faults")

    @property
    def active(self) -> bool:
        return self.start_failure_rate > 0 or self.hang_rate > 0


class SandboxSettings(Frozen):
    backend: Literal["bwrap", "docker", "e2b", "simulated"] = "bwrap"
    limits: LimitSettings = LimitSettings()
    pool: PoolSettings = PoolSettings()
    bwrap: BwrapSettings = BwrapSettings()
    docker: DockerSettings = DockerSettings()
    e2b: E2BSettings = E2BSettings()
    faults: SandboxFaultSettings = SandboxFaultSettings()


class TaskSettings(Frozen):
    """Harbor tasks, the verifier, and task generation from PyPI sdists."""

    root: str = Field(default="", description="task set directory; empty = <state_dir>/tasks/default")
    verifier_timeout_s: float = 300.0
    agent_timeout_s: float = Field(default=1800.0, description="written to each task's [agent] timeout_sec")
    python: str = Field(default="python3", description="interpreter that runs tests inside the sandbox")
    pypi_url: str = Field(default="https://pypi.org/pypi", description="PyPI JSON API base")
    download_timeout_s: float = 60.0
    build_concurrency: int = Field(default=2, description="sandboxes testing mutants at once")
    suite_timeout_s: float = Field(default=300.0, description="one full run of a library's test suite")
    mutant_timeout_s: float = Field(default=60.0, description="one run of a mutant's covering tests")
    max_mutants_tried: int = Field(default=400, description="candidates tested per library before giving up")
    max_per_function: int = Field(default=1, description="tasks from one function of a library")
    max_fail_to_pass: int = Field(default=100, description="mutants failing more tests are too obvious")
    check_concurrency: int = Field(default=2, description="tasks verified at once by `tasks check`")
    default_libraries: tuple[str, ...] = Field(
        default=("isodate==0.7.2", "tinydb==4.8.2", "cachetools==5.5.0"),
        description="sdists of the default task set (NAME==VERSION)",
    )
    default_per_library: int = Field(default=10, description="tasks per library in the default set")
    default_seed: int = 0
