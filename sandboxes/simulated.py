"""A simulated sandbox backend for benchmarks: no processes, only latencies.

`start()` sleeps a lognormal start time (reference run: median 1.9 s, p99 3.7 s),
`exec()` sleeps a lognormal command time and answers a short fixed output, all
multiplied by `time_scale` so a benchmark can run the reference workload faster
(or slower) than real time. `on_work` is told the unscaled seconds of every
start and command as it begins (the sleep follows at once), so a benchmark can
account the simulated work done up to any moment. A share of starts can fail
(`start_failure_rate`) to exercise the infrastructure-error path. Nothing here touches the workspace.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandboxes.base import ExecResult, SandboxStartError, Timings

Z99 = 2.3263478740408408
WorkHook = Callable[[float], None]


@dataclass(frozen=True)
class SimulatedLatency:
    """Unscaled seconds; `time_scale` converts them to wall seconds."""

    start_median_s: float = 1.9
    start_p99_s: float = 3.7
    exec_median_s: float = 0.4
    exec_sigma: float = 0.8
    start_failure_rate: float = 0.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.start_p99_s <= self.start_median_s:
            raise ValueError("start_p99_s must exceed start_median_s")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {self.time_scale}")

    def start_s(self, rng: random.Random) -> float:
        mu = math.log(self.start_median_s)
        return rng.lognormvariate(mu, (math.log(self.start_p99_s) - mu) / Z99)

    def exec_s(self, rng: random.Random) -> float:
        return rng.lognormvariate(math.log(self.exec_median_s), self.exec_sigma)


class SimulatedSandbox:
    backend = "simulated"

    def __init__(
        self, sandbox_id: str, latency: SimulatedLatency, rng: random.Random, on_work: WorkHook | None = None
    ) -> None:
        self.id = sandbox_id
        self.latency = latency
        self.rng = rng
        self.on_work = on_work
        self.timings = Timings()
        self.started = False

    async def start(self) -> None:
        t0 = time.monotonic()
        planned = self.latency.start_s(self.rng)
        if self.on_work is not None:
            self.on_work(planned)
        await asyncio.sleep(planned * self.latency.time_scale)
        if self.rng.random() < self.latency.start_failure_rate:
            raise SandboxStartError(f"simulated start failure of {self.id}", backend=self.backend)
        self.timings.start_s = (time.monotonic() - t0) / self.latency.time_scale
        self.started = True

    async def exec(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        t0 = time.monotonic()
        planned = self.latency.exec_s(self.rng)
        if self.on_work is not None:
            self.on_work(planned)
        await asyncio.sleep(planned * self.latency.time_scale)
        output = f"simulated output of: {command[:60]}\n"
        duration = (time.monotonic() - t0) / self.latency.time_scale
        self.timings.execs.append(duration)
        return ExecResult(0, output, "", duration, output_bytes=len(output))

    async def upload(self, local: Path, remote: str) -> None:
        return None

    async def download(self, remote: str, local: Path) -> None:
        return None

    async def stop(self) -> None:
        self.started = False


class SimulatedSandboxFactory:
    backend = "simulated"

    def __init__(
        self, latency: SimulatedLatency | None = None, seed: int = 0, on_work: WorkHook | None = None
    ) -> None:
        self.latency = latency or SimulatedLatency()
        self.rng = random.Random(seed)
        self.on_work = on_work
        self._ids = itertools.count()

    def create(self, workspace: Path | None) -> SimulatedSandbox:
        return SimulatedSandbox(f"sim-{next(self._ids)}", self.latency, self.rng, self.on_work)
