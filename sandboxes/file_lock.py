"""`file_lock(path)`: an exclusive flock(2) across processes, held for a `with` block.

Several processes (test sessions, workers, CLI calls) may build the same image or start the same
service at once; the lock makes them take turns. It lives in `sandboxes/`, the lowest package that
needs it (`sandboxes/` imports nothing of ours), so the launchers of `rollstream/` use this one too.
The SQL store's WAL switch keeps its own lock (streams/store/migrate.py): it gives up after the
busy timeout with an error that names the stuck process, and `streams/` cannot import `sandboxes/`.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created with its parents) for the block; waits for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
