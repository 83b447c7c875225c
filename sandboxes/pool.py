"""A pool of sandboxes with explicit, observable caps and an optional warm pool.

`async with pool.sandbox(workspace) as box` yields a started sandbox and always
stops it. Caps (all in `PoolSettings`): `max_running` sandboxes alive at once
(warm ones included), `max_starting` starts in flight, `starts_per_s`, and
`image_pulls_per_h` (for backends that pull images: the pool hands them
`image_pull` as their gate). Every wait on a cap is recorded (`cap_waits()`,
`cap_wait_stats()`), and `stats()` counts running, starting, warm, started and
failed sandboxes, so a report can say which cap binds.

Backends with caps of their own report waits on them here too (`WaitReporting`;
docker's `container_engine`), so they show with the pool's.

Warm pool: with `warm_pool = N` the pool keeps N sandboxes started ahead, with
empty workspaces, per image (`sandbox(workspace, image)`: the backend's default
image, and up to `warm_images` other images from their first request on;
`sandboxes/warm.py`), refilling at most `warm_starting` at a time so that refills
do not starve the handoffs of CPU. A request takes one when the backend can attach a workspace
to a started sandbox (`WorkspaceAttachable`) or needs none, and the pool starts
a replacement in the background; otherwise it starts one cold.

Failure: a start that raises becomes `SandboxStartError` (a `SandboxError` from
the backend is kept as is); a start that takes longer than `start_timeout_s`
becomes `SandboxTimeoutError`. Both are infrastructure errors, never a result. A
timeout of a start hang injected by `sandbox.faults` is marked `injected`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from pathlib import Path

from sandboxes.base import (
    ImageSandboxFactory,
    PullGated,
    Sandbox,
    SandboxError,
    SandboxFactory,
    SandboxStartError,
    SandboxTimeoutError,
    WaitReporting,
    WorkspaceAttachable,
    create_sandbox,
    fault_injected,
)
from sandboxes.caps import CapWait, CapWaits, HourlyWindow, StartRateGate, detach_request_waits, request_waits
from sandboxes.settings import SandboxSettings
from sandboxes.warm import WarmShelves

log = logging.getLogger(__name__)
WARM_RETRY_S = 1.0  # after a failed warm start, so a broken backend does not spin


@dataclass(frozen=True)
class PoolStats:
    running: int  # alive: starting, warm or handed out
    starting: int
    warm: int
    started: int  # starts that succeeded, ever
    failed: int  # starts that failed or timed out, ever
    warm_handoffs: int
    cold_starts: int


class SandboxPool:
    def __init__(self, settings: SandboxSettings, factory: SandboxFactory) -> None:
        self.settings = settings
        self.factory = factory
        self._caps = settings.pool
        self._waits = CapWaits()
        self._slots = asyncio.Condition()
        self._running = 0
        self._starting = 0
        self._start_gate = asyncio.Semaphore(self._caps.max_starting)
        self._rate = StartRateGate(self._caps.starts_per_s)
        self._pulls = HourlyWindow(self._caps.image_pulls_per_h)
        self._warm = WarmShelves(self._caps.warm_pool, self._caps.warm_images, self._caps.warm_starting)
        self._warm_tasks: set[asyncio.Task[None]] = set()
        self._finishing: set[asyncio.Future[None]] = set()  # shelving, stopping: close waits for them
        self._closed = False
        self._started = self._failed = self._handoffs = self._cold = 0
        if isinstance(factory, PullGated):
            factory.set_pull_gate(self.image_pull)
        if isinstance(factory, WaitReporting):
            factory.set_wait_recorder(self._waits.record)

    async def __aenter__(self) -> SandboxPool:
        self._refill_warm()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def sandbox(self, workspace: Path | None, image: str | None = None) -> AsyncIterator[Sandbox]:
        """A started sandbox over a copy of `workspace`, running `image` (None: the backend's
        default; from then on kept warm too), stopped on exit whatever happens."""
        if self._closed:
            raise SandboxStartError("the sandbox pool is closed", backend=self.factory.backend)
        if image is not None and not isinstance(self.factory, ImageSandboxFactory):
            create_sandbox(self.factory, workspace, image)  # raises: says which backend runs images
        for dropped in self._warm.asked(image):
            self._finish_in_background(self._dispose(dropped))
        queued = time.monotonic()
        with request_waits() as waits:
            box = await self._acquire(workspace, image, queued)
        box.timings.cap_waits = waits  # this request's own waits, by cap
        try:
            yield box
        finally:
            await self._dispose(box)

    def cap_waits(self) -> dict[str, float]:
        """Total seconds callers waited on each cap."""
        return self._waits.totals()

    def cap_wait_stats(self) -> dict[str, CapWait]:
        return self._waits.snapshot()

    def stats(self) -> PoolStats:
        return PoolStats(
            running=self._running,
            starting=self._starting,
            warm=self._warm.count(),
            started=self._started,
            failed=self._failed,
            warm_handoffs=self._handoffs,
            cold_starts=self._cold,
        )

    async def image_pull(self) -> None:
        """The gate a backend awaits before pulling an image (`image_pulls_per_h`)."""
        waited = await self._pulls.acquire()
        if waited > 0:
            self._waits.record("image_pulls", waited)

    async def close(self) -> None:
        """Stop the warm sandboxes and the warm refill; sandboxes in use stop on their own exit."""
        self._closed = True
        for task in list(self._warm_tasks):
            task.cancel()
        await asyncio.gather(*self._warm_tasks, return_exceptions=True)
        await asyncio.gather(*self._finishing, return_exceptions=True)
        for box in self._warm.drain():
            await self._dispose(box)

    async def _acquire(self, workspace: Path | None, image: str | None, queued: float) -> Sandbox:
        for attempt in range(2):
            warm = await self._claim(workspace, image)
            if warm is None:
                return await self._cold_start(workspace, image, queued)
            try:
                return await self._hand_off(warm, workspace, queued)
            except SandboxError as error:  # a warm sandbox that died while it waited
                if attempt:
                    raise
                log.warning("warm %s sandbox unusable, taking another: %s", warm.backend, error)
        raise AssertionError("unreachable")

    async def _cold_start(self, workspace: Path | None, image: str | None, queued: float) -> Sandbox:
        try:
            box = await self._start_new(workspace, image)
        except BaseException:
            await self._free_slot()
            raise
        finally:
            self._refill_warm()
        self._cold += 1
        box.timings.queued_s = time.monotonic() - queued - box.timings.start_s
        return box

    async def _claim(self, workspace: Path | None, image: str | None) -> Sandbox | None:
        """A warm sandbox that fits, or None after reserving a running slot for a cold start."""
        waited_since: float | None = None
        async with self._slots:
            while True:
                box = self._warm.take(
                    image, lambda warm: workspace is None or isinstance(warm, WorkspaceAttachable)
                )
                if box is not None:
                    break
                if self._running < self._caps.max_running:
                    self._running += 1
                    box = None
                    break
                waited_since = waited_since or time.monotonic()
                await self._slots.wait()
        if waited_since is not None:
            self._waits.record("running", time.monotonic() - waited_since)
        return box

    async def _hand_off(self, box: Sandbox, workspace: Path | None, queued: float) -> Sandbox:
        began = time.monotonic()
        self._refill_warm()
        try:
            if isinstance(box, WorkspaceAttachable):
                await box.attach_workspace(workspace)
        except BaseException as error:
            await self._dispose(box)
            if isinstance(error, SandboxError | asyncio.CancelledError):
                raise
            raise SandboxStartError(f"warm sandbox handoff failed: {error}", backend=box.backend) from error
        self._handoffs += 1
        box.timings.warm = True
        box.timings.queued_s = began - queued
        return box

    async def _start_new(self, workspace: Path | None, image: str | None) -> Sandbox:
        """Start one sandbox under the starting and rate caps; the caller holds a running slot."""
        if self._start_gate.locked():
            waited_since = time.monotonic()
            await self._start_gate.acquire()
            self._waits.record("starting", time.monotonic() - waited_since)
        else:
            await self._start_gate.acquire()
        self._starting += 1
        try:
            delay = self._rate.reserve()
            if delay > 0:
                self._waits.record("start_rate", delay)
                await asyncio.sleep(delay)
            return await self._start_one(workspace, image)
        finally:
            self._starting -= 1
            self._start_gate.release()

    async def _start_one(self, workspace: Path | None, image: str | None) -> Sandbox:
        backend = self.factory.backend
        box: Sandbox | None = None
        try:
            box = create_sandbox(self.factory, workspace, image)
            await asyncio.wait_for(box.start(), self._caps.start_timeout_s)
        except BaseException as error:
            if box is not None:
                await self._stop_quietly(box)
            if isinstance(error, asyncio.CancelledError):
                raise
            self._failed += 1
            if isinstance(error, TimeoutError):
                raise SandboxTimeoutError(
                    f"{backend} sandbox not started within {self._caps.start_timeout_s}s",
                    backend=backend,
                    injected=fault_injected(box),  # a start hang injected by sandbox.faults
                ) from error
            if isinstance(error, SandboxError):
                raise
            message = f"{backend} sandbox failed to start: {error!r}"
            raise SandboxStartError(message, backend=backend) from error
        self._started += 1
        return box

    def _refill_warm(self) -> None:
        if not self._closed:
            for image in self._warm.to_start():
                self._in_background(self._start_warm(image))

    def _in_background(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._warm_tasks.add(task)
        task.add_done_callback(self._warm_tasks.discard)

    def _finish_in_background(self, work: Coroutine[object, object, None]) -> asyncio.Future[None]:
        """Work that must finish even as the pool closes (close waits for it instead of cancelling)."""
        task = asyncio.ensure_future(work)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        return task

    async def _start_warm(self, image: str | None) -> None:
        detach_request_waits()  # started for no request in particular
        box: Sandbox | None = None
        try:
            box = await self._warm_box(image)
        finally:  # shielded, and awaited by close: a sandbox started as the pool closes is stopped
            await asyncio.shield(self._finish_in_background(self._shelve(image, box)))
        if not self._closed:
            self._refill_warm()

    async def _warm_box(self, image: str | None) -> Sandbox | None:
        """A started sandbox for the warm shelves, or None (the pool closed, or the start failed)."""
        async with self._slots:
            await self._slots.wait_for(lambda: self._running < self._caps.max_running or self._closed)
            if self._closed:
                return None
            self._running += 1
        try:
            return await self._start_new(None, image)
        except SandboxError as error:
            await self._free_slot()
            log.warning("warm sandbox failed to start: %s", error)
            await asyncio.sleep(WARM_RETRY_S)
            return None
        except BaseException:
            await self._free_slot()
            raise

    async def _shelve(self, image: str | None, box: Sandbox | None) -> None:
        async with self._slots:
            kept = self._warm.started(image, None if self._closed else box)
            self._slots.notify_all()
        if not kept and box is not None:
            await self._dispose(box)  # the pool closed, or its image is no longer kept warm

    async def _dispose(self, box: Sandbox) -> None:
        await self._stop_quietly(box)
        await self._free_slot()

    async def _free_slot(self) -> None:
        async with self._slots:
            self._running -= 1
            self._slots.notify_all()

    async def _stop_quietly(self, box: Sandbox) -> None:
        try:
            await box.stop()
        except Exception as error:  # a sandbox that cannot stop must not break the caller
            log.warning("stopping %s sandbox %s failed: %s", box.backend, box.id, error)
