"""One publish at a time, off the trainer's step path.

`BackgroundPublisher.start(work)` runs `work` (writing a version, announcing it, sending its
step's event) as a task while the trainer goes on collecting and training the next step;
`drain()` waits until it is done and raises what it raised. The contract the RL loop keeps
with it: drain before taking the next snapshot of the weights (so versions and step events
go out in order and only one snapshot is held) and before any checkpoint (so a checkpoint
of step N means version N is out: a trainer restarted from it never skips a version).
`close()` cancels a publish still running when the trainer leaves on an error; a version
cut off there is re-published after the restart (identical files, duplicate events dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any


class BackgroundPublisher:
    def __init__(self) -> None:
        self._pending: asyncio.Task[None] | None = None

    @property
    def busy(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the background; the one before must have been drained."""
        if self._pending is not None:
            work.close()
            raise RuntimeError("a publish is still pending: drain() before starting the next one")
        self._pending = asyncio.create_task(work)

    async def drain(self) -> None:
        """Wait for the pending publish, if any; its exception, if it failed, is raised here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await pending

    async def close(self) -> None:
        """Cancel a pending publish (the trainer is leaving on an error) and wait for it to stop."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        pending.cancel()  # a no-op once it has finished
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pending
