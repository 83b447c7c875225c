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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollstream.commands.common import ConfigPath, Overrides, console, fail, read_config
from sandboxes.backends import BACKENDS, make_factory
from sandboxes.base import SandboxError, SandboxFactory
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


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def start_latencies(
    settings: SandboxSettings,
    factory: SandboxFactory,
    repo: Path,
    n: int,
    concurrency: int,
    hold_s: float,
    advance: Callable[[], None],
) -> tuple[list[float], dict[str, object]]:
    """Seconds from request to a started sandbox, for `n` requests `concurrency` at a time."""
    latencies: list[float] = []
    gate = asyncio.Semaphore(concurrency)
    async with SandboxPool(settings, factory) as pool:
        await wait_for_warm(pool, settings.pool.warm_pool)

        async def one() -> None:
            async with gate:
                asked = time.monotonic()
                async with pool.sandbox(repo) as box:
                    latencies.append(time.monotonic() - asked)
                    result = await box.exec("test -f pkg/mod0.py")
                    if result.exit_code != 0:
                        raise RuntimeError(f"sandbox workspace incomplete: {result}")
                    await asyncio.sleep(hold_s)
            advance()

        await asyncio.gather(*(one() for _ in range(n)))
        details = {"stats": pool.stats().__dict__, "cap_waits_s": pool.cap_waits()}
    return latencies, details


async def wait_for_warm(pool: SandboxPool, size: int) -> None:
    deadline = time.monotonic() + WARM_FILL_TIMEOUT_S
    while pool.stats().warm < size:
        if time.monotonic() > deadline:
            raise RuntimeError(f"warm pool did not fill to {size} in {WARM_FILL_TIMEOUT_S}s")
        await asyncio.sleep(0.05)


async def exec_overhead(
    settings: SandboxSettings, factory: SandboxFactory, repo: Path, count: int, advance: Callable[[], None]
) -> tuple[float, float]:
    """Median seconds of `EXEC_COMMAND` through the sandbox and as a plain subprocess."""
    ours: list[float] = []
    plain: list[float] = []
    async with SandboxPool(settings, factory) as pool, pool.sandbox(repo) as box:
        for _ in range(count):
            began = time.monotonic()
            result = await box.exec(EXEC_COMMAND)
            ours.append(time.monotonic() - began)
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
            plain.append(time.monotonic() - began)
            if box.backend != "simulated" and result.stdout.encode() != stdout:
                raise RuntimeError("sandbox and plain subprocess disagree on the command's output")
            advance()
    return statistics.median(ours), statistics.median(plain)


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
    cold_s: list[float]
    warm_s: list[float]
    exec_s: float
    plain_s: float


async def measure(settings: SandboxSettings, plan: BenchPlan) -> Measured:
    """Run the three phases (exec, cold, warm handoff) with progress bars."""
    factory = make_factory(settings)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        tempfile.TemporaryDirectory() as scratch,
        Progress(*columns, console=console, transient=True) as bars,
    ):
        repo = write_repo(Path(scratch))
        phases = [("exec overhead", plan.exec_n), ("cold start", plan.n), ("warm handoff", plan.n)]
        tick = {
            name: functools.partial(bars.advance, bars.add_task(name, total=total)) for name, total in phases
        }
        # exec first: the start phases leave the kernel tearing down hundreds of namespaces for a while
        exec_s, plain_s = await exec_overhead(
            pool_variant(settings, 1, 0), factory, repo, plan.exec_n, tick["exec overhead"]
        )
        latencies = {}
        for name, warm in (("cold start", 0), ("warm handoff", plan.warm)):
            variant = pool_variant(settings, plan.concurrency, warm)
            latencies[name], details = await start_latencies(
                variant, factory, repo, plan.n, plan.concurrency, plan.hold_s, tick[name]
            )
            console.print(f"{name}: {details}")
    return Measured(latencies["cold start"], latencies["warm handoff"], exec_s, plain_s)


def figures(backend: str, plan: BenchPlan, measured: Measured) -> dict[str, object]:
    start_p50 = percentile(measured.warm_s, 0.5)
    return {
        "load_avg_1m": round(os.getloadavg()[0], 2),  # the machine is shared: read figures against it
        "backend": backend,
        "concurrency": plan.concurrency,
        "n": plan.n,
        "warm_pool": plan.warm,
        "hold_s": plan.hold_s,
        "headline": "warm_handoff",
        "start_p50_s": round(start_p50, 4),
        "start_p99_s": round(percentile(measured.warm_s, 0.99), 4),
        "cold_start_p50_s": round(percentile(measured.cold_s, 0.5), 4),
        "cold_start_p99_s": round(percentile(measured.cold_s, 0.99), 4),
        "exec_median_s": round(measured.exec_s, 5),
        "plain_subprocess_median_s": round(measured.plain_s, 5),
        "exec_overhead_ratio": round(measured.exec_s / measured.plain_s, 3),
        "ratio": round(E2B_START_MEDIAN_S / start_p50, 2),
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
    except SandboxError as error:
        fail(f"infra_error:{error.kind}: {error}")
    print(json.dumps(figures(backend, plan, measured)))
