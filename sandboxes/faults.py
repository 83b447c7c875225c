"""Fault injection around a real sandbox backend (`sandbox.faults`): a setting, not a test double.

`with_faults(factory, settings)` wraps a real `SandboxFactory` (`make_factory` does it when
any rate is above 0; with the defaults, all 0, nothing is wrapped). The wrapped sandboxes are
the backend's own; the wrapper only decides, per call, whether to inject:

- start failure (`start_failure_rate`): `start` raises `SandboxStartError` before the real
  start (kind `sandbox_start`).
- start hang (`hang_rate`): the real start runs, then the sandbox is frozen and `start`
  never returns; the pool's `pool.start_timeout_s` ends it (`SandboxTimeoutError`, kind
  `timeout`) and stops the sandbox.
- exec hang (`hang_rate`): the sandbox is frozen in place (`Freezable`: bwrap SIGSTOPs its
  process tree, docker pauses the container) and the real `exec` is called, so the
  backend's own handling of a hung sandbox ends it, as with a real hang: bwrap waits out
  the command's timeout + `bwrap.server_grace_s`; docker's engine refuses an exec into a
  paused container at once, which the backend reports as `SandboxTimeoutError`.
  Only backends that can freeze a sandbox take a hang rate (bwrap, docker); others refuse.
  Only the pool bounds a start: code that starts sandboxes itself (task build and check)
  would wait on a start hang forever, so run it without a hang rate.

Every injected fault is counted (`FaultySandboxFactory.injected`, by kind) and marked on the
error it causes (`SandboxError.injected`, and the sandbox's `fault_injected`, which the pool
reads when it turns a start hang into a timeout), so the episode can record it as injected
(`sandbox.failed.injected`, `trajectory.finished.injected`). With a warm pool, faults in warm
starts are absorbed by the pool (logged, started again) and reach no episode.

Draws are seeded (`seed`) and keyed by the call, not by a shared random stream: start N of a
factory, exec M of start N. The same sequence of calls gets the same faults.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sandboxes.base import (
    BackendUnavailableError,
    ExecResult,
    Freezable,
    PullGate,
    PullGated,
    Sandbox,
    SandboxError,
    SandboxFactory,
    SandboxStartError,
    Timings,
    WaitReporting,
    WorkspaceAttachable,
    create_sandbox,
)
from sandboxes.settings import SandboxFaultSettings

FREEZABLE_BACKENDS = ("bwrap", "docker")


def fault_draw(seed: int, *key: object) -> float:
    """A uniform number in [0, 1) fixed by (seed, key): the same call always draws the same."""
    digest = hashlib.blake2b(repr((seed, *key)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def injects(rate: float, seed: int, *key: object) -> bool:
    """Whether the call named by `key` gets the fault of this `rate` (never at rate 0)."""
    return rate > 0 and fault_draw(seed, *key) < rate


class FaultySandbox:
    """A real sandbox with `sandbox.faults` injected into its start and execs."""

    def __init__(self, factory: FaultySandboxFactory, inner: Sandbox, index: int) -> None:
        self._factory = factory
        self._inner = inner
        self._index = index
        self._execs = itertools.count()
        self.fault_injected = False

    @property
    def id(self) -> str:
        return self._inner.id

    @property
    def backend(self) -> str:
        return self._inner.backend

    @property
    def timings(self) -> Timings:
        return self._inner.timings

    @property
    def inner(self) -> Sandbox:
        return self._inner

    async def start(self) -> None:
        faults = self._factory.faults
        if injects(faults.start_failure_rate, faults.seed, "start_failure", self._index):
            self._injected("start_failure")
            raise SandboxStartError(
                f"injected fault: sandbox {self.id} did not start (sandbox.faults.start_failure_rate)",
                backend=self.backend,
                injected=True,
            )
        await self._inner.start()
        if injects(faults.hang_rate, faults.seed, "start_hang", self._index):
            self._injected("start_hang")
            await self._freeze()
            await asyncio.get_running_loop().create_future()  # never done: the pool's start timeout ends it

    async def exec(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        faults = self._factory.faults
        if not injects(faults.hang_rate, faults.seed, "exec_hang", self._index, next(self._execs)):
            return await self._inner.exec(command, timeout, cwd, env)
        self._injected("exec_hang")
        await self._freeze()
        try:
            return await self._inner.exec(command, timeout, cwd, env)  # waits out the backend's deadline
        except SandboxError as error:
            error.injected = True
            raise

    async def upload(self, local: Path, remote: str) -> None:
        await self._inner.upload(local, remote)

    async def download(self, remote: str, local: Path) -> None:
        await self._inner.download(remote, local)

    async def stop(self) -> None:
        await self._inner.stop()

    def _injected(self, kind: str) -> None:
        self.fault_injected = True
        self._factory.injected[kind] += 1

    async def _freeze(self) -> None:
        if not isinstance(self._inner, Freezable):
            raise BackendUnavailableError(
                f"sandbox.faults.hang_rate: {self.backend} sandboxes cannot be frozen", backend=self.backend
            )
        await self._inner.freeze()


class AttachableFaultySandbox(FaultySandbox):
    """A `FaultySandbox` over a sandbox that takes its workspace after start (warm pools)."""

    async def attach_workspace(self, workspace: Path | None) -> None:
        assert isinstance(self.inner, WorkspaceAttachable)
        await self.inner.attach_workspace(workspace)


class FaultySandboxFactory:
    """Wraps a real factory; `injected` counts the faults injected so far, by kind
    (`start_failure`, `start_hang`, `exec_hang`)."""

    def __init__(self, inner: SandboxFactory, faults: SandboxFaultSettings) -> None:
        if faults.hang_rate > 0 and inner.backend not in FREEZABLE_BACKENDS:
            raise BackendUnavailableError(
                f"sandbox.faults.hang_rate needs a backend that can freeze a sandbox "
                f"({', '.join(FREEZABLE_BACKENDS)}), not {inner.backend}",
                backend=inner.backend,
            )
        self.inner = inner
        self.faults = faults
        self.backend = inner.backend
        self.injected: Counter[str] = Counter()
        self._starts = itertools.count()

    def create(self, workspace: Path | None) -> Sandbox:
        return self._wrap(self.inner.create(workspace))

    def create_for_image(self, workspace: Path | None, image: str) -> Sandbox:
        return self._wrap(create_sandbox(self.inner, workspace, image))

    def _wrap(self, box: Sandbox) -> Sandbox:
        kind = AttachableFaultySandbox if isinstance(box, WorkspaceAttachable) else FaultySandbox
        return kind(self, box, next(self._starts))

    def set_pull_gate(self, gate: PullGate) -> None:
        """Passed on to a factory that pulls images (`PullGated`); others have nothing to gate."""
        if isinstance(self.inner, PullGated):
            self.inner.set_pull_gate(gate)

    def set_wait_recorder(self, record: Callable[[str, float], None]) -> None:
        """Passed on to a factory with caps of its own (`WaitReporting`)."""
        if isinstance(self.inner, WaitReporting):
            self.inner.set_wait_recorder(record)


def with_faults(factory: SandboxFactory, faults: SandboxFaultSettings) -> SandboxFactory:
    """`factory` with `faults` injected, or `factory` itself when every rate is 0."""
    if not faults.active:
        return factory
    return FaultySandboxFactory(factory, faults)
