"""The sandbox protocol every backend implements, and its typed infrastructure errors.

A command that fails is a result (`ExecResult` with its exit code); a sandbox that
cannot start, dies or stops answering raises a `SandboxError` subclass whose
`kind` is the infrastructure outcome (`sandbox_start`, `sandbox_lost`, `timeout`,
`verifier`), so callers never mistake infrastructure for a wrong answer.
Queueing, start and every exec report their timing (`Timings`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    output_bytes: int = 0
    output_truncated: bool = False
    killed_reason: str | None = None  # e.g. "memory", "cpu", "processes", "timeout"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def to_json_dict(self) -> dict[str, object]:
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "duration_s": self.duration_s,
            "timed_out": self.timed_out,
            "output_bytes": self.output_bytes,
            "output_truncated": self.output_truncated,
            "killed_reason": self.killed_reason,
        }


@dataclass
class Timings:
    """Seconds one sandbox spent queued, starting and in each exec; whether it came warm."""

    queued_s: float = 0.0
    start_s: float = 0.0
    start_attempts: int = 1  # tries the backend needed (a retried start is still one start)
    execs: list[float] = field(default_factory=list)
    warm: bool = False  # handed out from the pool's warm sandboxes (started ahead of the request)
    cap_waits: dict[str, float] = field(default_factory=dict)  # seconds the request waited, by pool cap


class SandboxError(Exception):
    """An infrastructure failure. `kind` names the `infra_error:*` outcome; `injected` says
    that `sandbox.faults` caused it (fault injection), so it can be counted against what was injected."""

    kind = "sandbox_lost"

    def __init__(self, message: str, *, backend: str = "", injected: bool = False) -> None:
        super().__init__(message)
        self.backend = backend
        self.injected = injected


class SandboxStartError(SandboxError):
    kind = "sandbox_start"


class SandboxLostError(SandboxError):
    kind = "sandbox_lost"


class SandboxTimeoutError(SandboxError):
    """The sandbox (not a command in it) stopped answering within its deadline."""

    kind = "timeout"


class VerifierError(SandboxError):
    """The verifier crashed, timed out, or wrote no readable reward: never reward 0."""

    kind = "verifier"


class BackendUnavailableError(SandboxStartError):
    """The backend cannot run here at all (no bwrap, no docker API, no E2B key)."""


@runtime_checkable
class Sandbox(Protocol):
    """One isolated environment with a writable workspace."""

    id: str
    backend: str
    timings: Timings

    async def start(self) -> None: ...

    async def exec(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult: ...

    async def upload(self, local: Path, remote: str) -> None: ...

    async def download(self, remote: str, local: Path) -> None: ...

    async def stop(self) -> None: ...


@runtime_checkable
class Freezable(Protocol):
    """A sandbox that can be frozen in place: alive, but answering nothing (a real hang, for
    `sandbox.faults.hang_rate`); the backend's own deadlines then end what waits on it."""

    async def freeze(self) -> None: ...


@runtime_checkable
class FaultRecording(Protocol):
    """A sandbox that knows whether a fault was injected into it (`sandboxes.faults`), so a
    caller that turns its hang into an error (the pool's start timeout) can mark it injected."""

    @property
    def fault_injected(self) -> bool: ...


def fault_injected(box: object) -> bool:
    """Whether a fault was injected into `box` (False for sandboxes without fault injection)."""
    return isinstance(box, FaultRecording) and box.fault_injected


@runtime_checkable
class WorkspaceAttachable(Protocol):
    """A sandbox that can be started empty and given its workspace later (warm pools)."""

    async def attach_workspace(self, workspace: Path | None) -> None: ...


class PullGate(Protocol):
    """Awaited by a backend before each image pull; waits while the pull cap is spent."""

    async def __call__(self) -> None: ...


@runtime_checkable
class PullGated(Protocol):
    """A factory that pulls images and lets the pool gate its pulls (`pool.image_pulls_per_h`)."""

    def set_pull_gate(self, gate: PullGate) -> None: ...


@runtime_checkable
class WaitReporting(Protocol):
    """A factory with caps of its own (docker: `container_engine`) that reports waits on them
    to the pool, which counts them with its own caps (`sandboxes/caps.py`)."""

    def set_wait_recorder(self, record: Callable[[str, float], None]) -> None: ...


@runtime_checkable
class ImageSandboxFactory(Protocol):
    """A factory whose sandboxes run an image of the caller's choosing (docker)."""

    def create_for_image(self, workspace: Path | None, image: str) -> Sandbox: ...


class SandboxFactory(Protocol):
    """Makes an unstarted sandbox over a workspace (a task's repository directory)."""

    backend: str

    def create(self, workspace: Path | None) -> Sandbox: ...


def create_sandbox(factory: SandboxFactory, workspace: Path | None, image: str | None) -> Sandbox:
    """An unstarted sandbox over `workspace`, running `image` (None: the backend's default)."""
    if image is None:
        return factory.create(workspace)
    if not isinstance(factory, ImageSandboxFactory):
        raise SandboxStartError(
            f"the {factory.backend} backend runs no container images (asked for {image}); "
            'tasks with [environment] docker_image need sandbox.backend = "docker"',
            backend=factory.backend,
        )
    return factory.create_for_image(workspace, image)
