"""`rollstream bench sandbox`: sandbox start latency and exec overhead, with baselines in the same run.

Start latency is the time from asking the pool for a sandbox over a small task
repository (`REPO_FILES` files) to holding a started one, with `--concurrency`
callers asking at once, `--n` in all, each holding its sandbox `--hold-s`
seconds (an episode, shortened) and running one command. Measured twice:

- cold: `pool.warm_pool = 0`, every request starts a sandbox (for bwrap: copy
  the repository, spawn `bwrap`, wait for the exec server's `ready`);
- warm handoff: `pool.warm_pool = --warm`, requests take a sandbox started
  ahead, and the pool copies the repository into it.

The headline `start_p50_s`/`start_p99_s` are the warm-handoff figures (what a
rollout worker sees with the default warm pool); `cold_start_*` are reported
next to them, and `headline` names the choice. `ratio` = E2B's reported median
start (1.9 s) / our headline median.

Exec overhead: the same command (`EXEC_COMMAND`, an agent-style grep over the
repository) run `--exec-n` times through `Sandbox.exec` and as a plain
`/bin/sh -c` subprocess from the same event loop, interleaved;
`exec_overhead_ratio` = median sandbox exec / median plain subprocess.

Failures are figures, not the end of the run: a start or command that raises a
`SandboxError` (or a sandbox whose workspace is incomplete) is counted by phase
and kind (`failures`, `failure_kinds`, `failures_by_phase`; the first message of
each kind is printed) and the run goes on. A start the backend had to try again
(docker: a transient engine error) is one start, timed from its first try;
`retried_starts` and `start_retries` count them. Percentiles of a phase with no
successful sample are null.

Docker only, the engine's own floor, in the same run (`bench/sandbox_engine.py`):
`podman run --rm IMAGE true` at the same concurrency, as many as starts
(`engine_run_p50_s`), and `cold_ratio` = cold start p50 / that p50: how far our cold
start (container, helper, workspace, under the pool's and the engine's caps) is from
what the engine takes for a container that does nothing.

`--hold-s` (default 5 s) stands in for an episode, which in a real run holds
its sandbox for minutes: shorter holds ask the warm pool to refill faster than
a real run would. `load_avg_1m` is reported because the figures on a shared
machine move with its load.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from bench.figures import percentile
from bench.sandbox_engine import EngineRuns, engine_run_argv, engine_runs
from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from sandboxes.backends import BACKENDS, make_factory
from sandboxes.base import Sandbox, SandboxError, SandboxFactory, Timings
from sandboxes.pool import SandboxPool
from sandboxes.settings import SandboxSettings

E2B_START_MEDIAN_S = 1.9
REPO_FILES = 40
EXEC_COMMAND = "grep -n 'def ' pkg/mod1.py | head -n 20"
WARM_FILL_TIMEOUT_S = 300.0


def write_repo(root: Path) -> Path:
    """A small task-like repository: a package of `REPO_FILES` modules and a test file."""
    package = root / "repo" / "pkg"
    package.mkdir(parents=True)
    for index in range(REPO_FILES):
        body = "".join(f"def f{index}_{n}(x):\n    return x + {n}\n\n" for n in range(40))
        (package / f"mod{index}.py").write_text(body)
    (root / "repo" / "test_pkg.py").write_text(
        "from pkg.mod0 import f0_1\n\ndef test_f():\n    assert f0_1(1) == 2\n"
    )
    return root / "repo"


@dataclass
class FailureTally:
    """Failures of one phase: how many of each kind, and the first message of each kind."""

    kinds: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def record(self, kind: str, message: str) -> None:
        self.kinds[kind] += 1
        self.examples.setdefault(kind, message)

    @property
    def count(self) -> int:
        return sum(self.kinds.values())


@dataclass
class StartSamples:
    """One start phase: latencies and tries of the starts that succeeded, and the failures."""

    latencies: list[float] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    failures: FailureTally = field(default_factory=FailureTally)

    def started(self, latency_s: float, timings: Timings) -> None:
        self.latencies.append(latency_s)
        self.attempts.append(timings.start_attempts)


async def start_latencies(
    settings: SandboxSettings,
    factory: SandboxFactory,
    repo: Path,
    plan: BenchPlan,
    advance: Callable[[], None],
) -> tuple[StartSamples, dict[str, object]]:
    """Seconds from request to a started sandbox, for `plan.n` requests `plan.concurrency` at a time."""
    samples = StartSamples()
    gate = asyncio.Semaphore(plan.concurrency)
    async with SandboxPool(settings, factory) as pool:
        await wait_for_warm(pool, settings.pool.warm_pool)

        async def one() -> None:
            async with gate:
                asked = time.monotonic()
                try:
                    async with pool.sandbox(repo) as box:
                        samples.started(time.monotonic() - asked, box.timings)
                        result = await box.exec("test -f pkg/mod0.py")
                        if result.exit_code != 0:
                            samples.failures.record("workspace_incomplete", f"{result}")
                        await asyncio.sleep(plan.hold_s)
                except SandboxError as error:
                    samples.failures.record(error.kind, str(error))
            advance()

        await asyncio.gather(*(one() for _ in range(plan.n)))
        details = {"stats": pool.stats().__dict__, "cap_waits_s": pool.cap_waits()}
    return samples, details


async def wait_for_warm(pool: SandboxPool, size: int) -> None:
    deadline = time.monotonic() + WARM_FILL_TIMEOUT_S
    while pool.stats().warm < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm pool did not fill to {size} in {WARM_FILL_TIMEOUT_S}s")
        await asyncio.sleep(0.05)


@dataclass
class ExecSamples:
    """Seconds of each command through the sandbox and as a plain subprocess; the failures."""

    ours: list[float] = field(default_factory=list)
    plain: list[float] = field(default_factory=list)
    failures: FailureTally = field(default_factory=FailureTally)


async def exec_overhead(
    settings: SandboxSettings, factory: SandboxFactory, repo: Path, count: int, advance: Callable[[], None]
) -> ExecSamples:
    """`EXEC_COMMAND` timed through one sandbox and as a plain subprocess, interleaved."""
    samples = ExecSamples()
    try:
        async with SandboxPool(settings, factory) as pool, pool.sandbox(repo) as box:
            for _ in range(count):
                await exec_once(box, repo, samples)
                advance()
    except SandboxError as error:  # the sandbox did not start or was lost: the phase ends here
        samples.failures.record(error.kind, str(error))
    return samples


async def exec_once(box: Sandbox, repo: Path, samples: ExecSamples) -> None:
    began = time.monotonic()
    result = await box.exec(EXEC_COMMAND)
    samples.ours.append(time.monotonic() - began)
    began = time.monotonic()
    process = await asyncio.create_subprocess_exec(
        "/bin/sh",
        "-c",
        EXEC_COMMAND,
        cwd=repo,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, _ = await process.communicate()
    samples.plain.append(time.monotonic() - began)
    if box.backend != "simulated" and result.stdout.encode() != stdout:
        samples.failures.record("output_mismatch", f"sandbox printed {result.stdout[:200]!r}")


def pool_variant(settings: SandboxSettings, concurrency: int, warm: int) -> SandboxSettings:
    caps = settings.pool.model_copy(
        update={"warm_pool": warm, "max_running": concurrency + warm, "max_starting": concurrency}
    )
    return settings.model_copy(update={"pool": caps})


@dataclass(frozen=True)
class BenchPlan:
    n: int
    concurrency: int
    warm: int
    hold_s: float
    exec_n: int


@dataclass(frozen=True)
class Measured:
    cold: StartSamples
    warm: StartSamples
    execs: ExecSamples
    engine: EngineRuns | None = None  # docker: the engine's own floor, `run --rm IMAGE true`
    load_avg_1m_start: float | None = None

    def failures_by_phase(self) -> dict[str, FailureTally]:
        return {
            "exec": self.execs.failures,
            "cold_start": self.cold.failures,
            "warm_handoff": self.warm.failures,
        }


async def measure(settings: SandboxSettings, plan: BenchPlan) -> Measured:
    """Run the three phases (exec, cold, warm handoff) with progress bars."""
    load_start = round(os.getloadavg()[0], 2)
    factory = make_factory(settings)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        tempfile.TemporaryDirectory() as scratch,
        Progress(*columns, console=console, transient=True) as bars,
    ):
        repo = write_repo(Path(scratch))
        engine_argv = engine_run_argv(settings) if settings.backend == "docker" else None
        phases = [("exec overhead", plan.exec_n), ("cold start", plan.n), ("warm handoff", plan.n)]
        phases += [("engine run --rm", plan.n)] if engine_argv else []
        tick = {
            name: functools.partial(bars.advance, bars.add_task(name, total=total)) for name, total in phases
        }
        # exec first: the start phases leave the kernel tearing down hundreds of namespaces for a while
        execs = await exec_overhead(
            pool_variant(settings, 1, 0), factory, repo, plan.exec_n, tick["exec overhead"]
        )
        engine = None
        if engine_argv:
            engine = await engine_runs(engine_argv, plan.n, plan.concurrency, tick["engine run --rm"])
        starts = {}
        for name, warm in (("cold start", 0), ("warm handoff", plan.warm)):
            variant = pool_variant(settings, plan.concurrency, warm)
            starts[name], details = await start_latencies(variant, factory, repo, plan, tick[name])
            console.print(f"{name}: {details}")
    measured = Measured(starts["cold start"], starts["warm handoff"], execs, engine, load_start)
    for phase, tally in measured.failures_by_phase().items():
        for kind, message in tally.examples.items():
            console.print(f"{phase} failure {kind} (x{tally.kinds[kind]}), first: {message}")
    if engine is not None and engine.failures:
        console.print(f"engine run --rm failed x{len(engine.failures)}, first: {engine.failures[0]}")
    return measured


def rounded_percentile(values: list[float], q: float) -> float | None:
    return round(percentile(values, q), 4) if values else None


def failure_figures(measured: Measured) -> dict[str, object]:
    by_phase = measured.failures_by_phase()
    kinds: Counter[str] = Counter()
    for tally in by_phase.values():
        kinds.update(tally.kinds)
    attempts = measured.cold.attempts + measured.warm.attempts
    return {
        "failures": sum(kinds.values()),
        "failure_kinds": dict(kinds),
        "failures_by_phase": {phase: tally.count for phase, tally in by_phase.items()},
        "retried_starts": sum(1 for tries in attempts if tries > 1),
        "start_retries": sum(tries - 1 for tries in attempts),
        "retries": sum(tries - 1 for tries in attempts),  # every try past the first, all phases
    }


def engine_figures(measured: Measured) -> dict[str, object]:
    """The engine's floor and our cold start against it (docker; null elsewhere)."""
    runs = measured.engine.latencies if measured.engine else []
    floor = rounded_percentile(runs, 0.5)
    cold = rounded_percentile(measured.cold.latencies, 0.5)
    return {
        "engine_run_p50_s": floor,
        "engine_run_p99_s": rounded_percentile(runs, 0.99),
        "engine_run_failures": len(measured.engine.failures) if measured.engine else None,
        "cold_ratio": round(cold / floor, 3) if cold and floor else None,
    }


def exec_figures(execs: ExecSamples) -> dict[str, object]:
    if not execs.ours:
        return {"exec_median_s": None, "plain_subprocess_median_s": None, "exec_overhead_ratio": None}
    ours, plain = statistics.median(execs.ours), statistics.median(execs.plain)
    return {
        "exec_median_s": round(ours, 5),
        "plain_subprocess_median_s": round(plain, 5),
        "exec_overhead_ratio": round(ours / plain, 3),
    }


def figures(backend: str, plan: BenchPlan, measured: Measured) -> dict[str, object]:
    warm_s, cold_s = measured.warm.latencies, measured.cold.latencies
    start_p50 = rounded_percentile(warm_s, 0.5)
    return {
        "load_avg_1m_start": measured.load_avg_1m_start,  # the machine is shared: read figures against it
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "backend": backend,
        "concurrency": plan.concurrency,
        "n": plan.n,
        "warm_pool": plan.warm,
        "hold_s": plan.hold_s,
        "headline": "warm_handoff",
        "start_p50_s": start_p50,
        "start_p99_s": rounded_percentile(warm_s, 0.99),
        "cold_start_p50_s": rounded_percentile(cold_s, 0.5),
        "cold_start_p99_s": rounded_percentile(cold_s, 0.99),
        **exec_figures(measured.execs),
        **engine_figures(measured),
        "ratio": round(E2B_START_MEDIAN_S / start_p50, 2) if start_p50 else None,
        **failure_figures(measured),
    }


def command(
    backend: Annotated[str, typer.Option(help=f"one of {', '.join(BACKENDS)}")] = "bwrap",
    concurrency: Annotated[int, typer.Option(help="callers asking for sandboxes at once")] = 64,
    n: Annotated[int, typer.Option(help="sandboxes started per phase")] = 512,
    warm: Annotated[int | None, typer.Option(help="warm pool size; default = concurrency")] = None,
    hold_s: Annotated[float, typer.Option(help="seconds each caller holds its sandbox (an episode)")] = 5.0,
    exec_n: Annotated[int, typer.Option(help="commands timed for the exec overhead")] = 200,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Start latency (cold and warm handoff) and exec overhead against a plain subprocess."""
    if backend not in BACKENDS:
        fail(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}", code=2)
    if min(concurrency, n, exec_n) < 1 or hold_s < 0:
        fail("--concurrency, --n and --exec-n must be >= 1 and --hold-s >= 0", code=2)
    settings = read_config(config, overrides).sandbox.model_copy(update={"backend": backend})
    plan = BenchPlan(n, concurrency, concurrency if warm is None else warm, hold_s, exec_n)
    try:
        measured = asyncio.run(measure(settings, plan))
    except SandboxError as error:  # outside any phase: the backend cannot run here at all
        fail(f"infra_error:{error.kind}: {error}")
    print(json.dumps(figures(backend, plan, measured)))
    if not (measured.cold.latencies or measured.warm.latencies or measured.execs.ours):
        fail("every start and command failed: see failure_kinds above")
