"""Cap bookkeeping for the sandbox pool: how long callers waited on each cap, and rate gates.

Each cap the pool enforces (`running`, `starting`, `start_rate`, `image_pulls`), and
each one a backend enforces and reports to it (`container_engine`: the docker backend's
container creates+starts in flight, `sandbox.docker.engine_concurrency`), records
the total and longest wait and how many callers had to wait, so a report can say
which cap binds instead of blaming the GPUs. Inside `request_waits()` a
request also collects its own share (the pool puts it on the sandbox's `Timings`,
and the episode on `sandbox.ready`), so each event says which cap it waited on.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

CAP_NAMES = ("running", "starting", "start_rate", "image_pulls", "container_engine")


@dataclass(frozen=True)
class CapWait:
    """Waits on one cap: total and longest seconds, and how many callers waited."""

    total_s: float = 0.0
    max_s: float = 0.0
    count: int = 0


_REQUEST_WAITS: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "sandbox_request_cap_waits", default=None
)


@contextlib.contextmanager
def request_waits() -> Iterator[dict[str, float]]:
    """Collect, per cap, the seconds the current task (and tasks it starts) waits on caps."""
    waits: dict[str, float] = {}
    token = _REQUEST_WAITS.set(waits)
    try:
        yield waits
    finally:
        _REQUEST_WAITS.reset(token)


def detach_request_waits() -> None:
    """A background task (a warm start) waits on no request's behalf."""
    _REQUEST_WAITS.set(None)


class CapWaits:
    def __init__(self) -> None:
        self._waits = {name: CapWait() for name in CAP_NAMES}

    def record(self, cap: str, waited_s: float) -> None:
        old = self._waits[cap]
        self._waits[cap] = CapWait(old.total_s + waited_s, max(old.max_s, waited_s), old.count + 1)
        mine = _REQUEST_WAITS.get()
        if mine is not None:
            mine[cap] = mine.get(cap, 0.0) + waited_s

    def totals(self) -> dict[str, float]:
        return {name: wait.total_s for name, wait in self._waits.items()}

    def snapshot(self) -> dict[str, CapWait]:
        return dict(self._waits)


class StartRateGate:
    """Spaces starts `1 / per_s` seconds apart (0 = unlimited)."""

    def __init__(self, per_s: float) -> None:
        self._interval = 1.0 / per_s if per_s > 0 else 0.0
        self._next_at = 0.0

    def reserve(self) -> float:
        """Take the next start slot; returns how long the caller must sleep first."""
        if not self._interval:
            return 0.0
        now = time.monotonic()
        at = max(now, self._next_at)
        self._next_at = at + self._interval
        return at - now


class HourlyWindow:
    """At most `per_h` events in any sliding hour (0 = unlimited)."""

    WINDOW_S = 3600.0

    def __init__(self, per_h: int) -> None:
        self._per_h = per_h
        self._times: deque[float] = deque()
        self._lock = asyncio.Lock()

    async def acquire(self) -> float:
        """Wait for room in the window, record this event; returns seconds waited."""
        began = time.monotonic()
        if self._per_h <= 0:
            return 0.0
        async with self._lock:
            while True:
                now = time.monotonic()
                while self._times and now - self._times[0] >= self.WINDOW_S:
                    self._times.popleft()
                if len(self._times) < self._per_h:
                    self._times.append(now)
                    return now - began
                await asyncio.sleep(self._times[0] + self.WINDOW_S - now)
