"""The container engine's own floor for a container start, for `bench sandbox --backend docker`.

`podman run --rm IMAGE true` (or `docker run`, when there is no podman), run `n` times
with `concurrency` at once, each timed from spawning the CLI to its exit: create, start,
run `true`, wait, remove — a container start that does nothing, by the engine alone. The
container gets the sandbox's own settings (no network, memory and pids caps, rlimits,
dropped capabilities), so the floor is for the same container our start makes; without
the rlimits podman's defaults would not even start here (`error setting rlimit`).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rollstream.launcher.podman import PODMAN
from sandboxes.settings import SandboxSettings


@dataclass
class EngineRuns:
    """Seconds each `run --rm IMAGE true` took, and the messages of those that failed."""

    latencies: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def engine_run_argv(settings: SandboxSettings) -> list[str] | None:
    """The CLI run of a container like a sandbox's that runs `true`; None without a CLI."""
    if shutil.which("podman"):
        cli = list(PODMAN)
    elif shutil.which("docker"):
        cli = ["docker"]
    else:
        return None
    docker, limits = settings.docker, settings.limits
    memory = f"{limits.memory_mb}m"
    argv = [*cli, "run", "--rm", "--network", "none", "--memory", memory, "--memory-swap", memory]
    argv += ["--pids-limit", str(limits.max_processes), "--security-opt", "no-new-privileges"]
    argv += ["--ulimit", f"cpu={limits.cpu_time_s}:{limits.cpu_time_s}"]
    for name, value in (("nofile", docker.ulimit_nofile), ("nproc", docker.ulimit_nproc)):
        if value > 0:
            argv += ["--ulimit", f"{name}={value}:{value}"]
    for capability in ("NET_RAW", "MKNOD", "AUDIT_WRITE"):
        argv += ["--cap-drop", capability]
    return [*argv, docker.image, "true"]


async def engine_runs(argv: list[str], n: int, concurrency: int, advance: Callable[[], None]) -> EngineRuns:
    runs = EngineRuns()
    gate = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with gate:
            began = time.monotonic()
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
            )
            _, stderr = await process.communicate()
            if process.returncode == 0:
                runs.latencies.append(time.monotonic() - began)
            else:
                runs.failures.append(stderr.decode(errors="replace").strip()[-300:])
        advance()

    await asyncio.gather(*(one() for _ in range(n)))
    return runs
