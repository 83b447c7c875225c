"""Ending a `bwrap` process tree for sure, without ever blocking the caller for long.

`bwrap` forks a child that becomes pid 1 of the sandbox's PID namespace. Killing
only the outer `bwrap` while that child is still being set up leaves the child
orphaned (its die-with-parent signal is not armed yet), blocked forever; and
while the kernel is busy creating or tearing down network namespaces a killed
`bwrap` can take seconds to exit. So `kill_tree` kills the process group (the
outer `bwrap` is started as a process group leader, and the early child shares its
group) and every descendant found in /proc, and `Reaper` waits for the exit in
the background, killing again, when it takes longer than the stop timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
REKILL_INTERVAL_S = 1.0  # how often a slow-dying tree is killed again
REAP_GIVE_UP_S = 600.0


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants (via /proc/<pid>/task/<pid>/children)."""
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        frontier.extend(int(child) for child in children)
    return found


def kill_tree(leader: int) -> None:
    """SIGKILL the process group led by `leader` and every descendant of it."""
    pids = process_tree(leader)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signal.SIGKILL)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def freeze_tree(leader: int) -> None:
    """SIGSTOP `leader` and every descendant: alive, answering nothing (an injected hang).
    `kill_tree`'s SIGKILL still ends a frozen tree."""
    for pid in process_tree(leader):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGSTOP)


class Reaper:
    """Waits for killed `bwrap` trees that outlive the stop timeout, then runs their cleanup."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    async def end(
        self, process: asyncio.subprocess.Process, timeout_s: float, cleanup: Callable[[], None]
    ) -> bool:
        """Kill `process`'s tree; True when it exited within `timeout_s` (cleanup done), else reap later."""
        kill_tree(process.pid)
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), timeout_s)
        except TimeoutError:
            log.warning(
                "bwrap %d still alive %.0fs after SIGKILL; reaping it in the background",
                process.pid,
                timeout_s,
            )
            task = asyncio.get_running_loop().create_task(self._reap(process, cleanup))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            return False
        cleanup()
        return True

    async def shielded_spawn(
        self, spawn: asyncio.Future[asyncio.subprocess.Process]
    ) -> asyncio.subprocess.Process:
        """Await a spawn; if the caller is cancelled, the spawn still completes and its tree is ended."""
        try:
            return await asyncio.shield(spawn)
        except asyncio.CancelledError:
            spawn.add_done_callback(self._end_orphan)
            raise

    def _end_orphan(self, spawn: asyncio.Future[asyncio.subprocess.Process]) -> None:
        if spawn.cancelled() or spawn.exception() is not None:
            return
        process = spawn.result()
        kill_tree(process.pid)
        task = asyncio.get_running_loop().create_task(self._reap(process, lambda: None))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reap(self, process: asyncio.subprocess.Process, cleanup: Callable[[], None]) -> None:
        waited = 0.0
        while waited < REAP_GIVE_UP_S:
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), REKILL_INTERVAL_S)
            except TimeoutError:
                waited += REKILL_INTERVAL_S
                kill_tree(process.pid)
                continue
            cleanup()
            return
        log.error("bwrap %d did not exit %.0fs after SIGKILL; its uid stays reserved", process.pid, waited)
