"""Liveness heartbeats for supervised processes: a file rewritten from the process's event loop.

Contract: a supervisor names a file in `ROLLSTREAM_HEARTBEAT_FILE` and an interval in
`ROLLSTREAM_HEARTBEAT_INTERVAL_S` in a child's environment. The child calls
`start_heartbeat()` from inside its running asyncio loop (the loop its real work runs
on: the consumer loop of a worker, the sink, the trainer; the HTTP loop of an engine).
That starts a task in the same loop which rewrites the file (`<pid> <unix time>`) every
interval, so the file's modification time is the last moment the loop made progress: a
loop blocked by synchronous work, a deadlock or a SIGSTOP stops the beats, and the
supervisor restarts a process whose beat is older than its `hung_after_s`.

`check`, when given, is asked before each beat; a beat is skipped while it returns
False (the engine: its scheduler thread must answer). Without the environment variable
`start_heartbeat` does nothing and returns None: unsupervised runs write no files.

Ranks: a process started by torchrun with WORLD_SIZE > 1 (the data-parallel trainer)
beats its own file, `rank_file(file, RANK)`, so one hung rank shows while the others
beat on; each rank also touches `start_file(file)` when it starts (`mark_rank_start`),
so after torchrun restarts the group the supervisor waits for the new ranks' first
beats (its startup grace) instead of reading the old ranks' files as a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

HEARTBEAT_FILE_ENV = "ROLLSTREAM_HEARTBEAT_FILE"
RANK_ENV, WORLD_SIZE_ENV = "RANK", "WORLD_SIZE"  # set by torchrun for each rank
HEARTBEAT_INTERVAL_ENV = "ROLLSTREAM_HEARTBEAT_INTERVAL_S"
DEFAULT_INTERVAL_S = 2.0  # used only when the supervisor names a file but no interval

log = logging.getLogger(__name__)
_TASKS: set[asyncio.Task[None]] = set()  # strong references: the loop keeps only weak ones


def write_beat(path: Path) -> None:
    """Rewrite `path` now (its mtime is the beat); errors are logged, never raised."""
    try:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # ranks may touch one start file
        tmp.write_text(f"{os.getpid()} {time.time():.3f}\n")
        tmp.replace(path)
    except OSError as error:
        log.warning("cannot write heartbeat %s: %s", path, error)


def beat_age_s(path: Path, since: float) -> float | None:
    """Seconds since the last beat written after `since` (unix time); None = none since then."""
    try:
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return None
    if mtime < since:
        return None
    return max(0.0, time.time() - mtime)


def rank_file(path: Path, rank: int) -> Path:
    """The heartbeat file of one rank of a process group beating `path`."""
    return path.with_name(f"{path.name}.rank{rank}")


def start_file(path: Path) -> Path:
    """Touched by every rank of a group beating `path` when it starts: the group's start time."""
    return path.with_name(f"{path.name}.start")


def _rank() -> int | None:
    """This process's rank when it is one of several (torchrun's environment), else None."""
    try:
        world = int(os.environ.get(WORLD_SIZE_ENV, "1"))
        return int(os.environ[RANK_ENV]) if world > 1 else None
    except (KeyError, ValueError):
        return None


def beat_pid(path: Path) -> int | None:
    """The pid that wrote the beat file `path` (None: no file, or not a beat)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def heartbeat_target() -> tuple[Path, float] | None:
    """(file, interval) named by the supervisor in this process's environment, or None; a rank
    of several beats its own `rank_file`."""
    name = os.environ.get(HEARTBEAT_FILE_ENV, "")
    if not name:
        return None
    try:
        interval = float(os.environ.get(HEARTBEAT_INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        interval = DEFAULT_INTERVAL_S
    rank = _rank()
    path = Path(name) if rank is None else rank_file(Path(name), rank)
    return path, max(interval, 0.05)


def mark_rank_start() -> None:
    """A rank of several, supervised: touch the group's `start_file` now (see the module docstring)."""
    name = os.environ.get(HEARTBEAT_FILE_ENV, "")
    if name and _rank() is not None:
        write_beat(start_file(Path(name)))


async def beat_forever(path: Path, interval_s: float, check: Callable[[], bool] | None = None) -> None:
    """Beat every `interval_s` in the running loop until cancelled."""
    while True:
        healthy = True
        if check is not None:
            try:
                healthy = check()
            except Exception as error:  # a failing check is a missed beat, not a crash
                log.warning("heartbeat check failed: %s", error)
                healthy = False
        if healthy:
            write_beat(path)
        await asyncio.sleep(interval_s)


def start_heartbeat(check: Callable[[], bool] | None = None) -> asyncio.Task[None] | None:
    """Start beating from the running loop when supervised (see the module docstring)."""
    target = heartbeat_target()
    if target is None:
        return None
    path, interval = target
    task = asyncio.get_running_loop().create_task(beat_forever(path, interval, check), name="heartbeat")
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
    return task


async def stop_heartbeat(task: asyncio.Task[None] | None) -> None:
    """Cancel a task from `start_heartbeat` (None is fine) and wait for it."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
