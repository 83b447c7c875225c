"""Host uids for bubblewrap sandboxes: one per live sandbox, across every process on the host.

A sandbox's commands run as its own uid so that RLIMIT_NPROC (which counts a
uid's processes host-wide) contains a fork bomb to that sandbox. Several
rollout workers on one host must therefore never hand out the same uid at
once: each uid is claimed with a non-blocking `flock` on `<lock_dir>/<uid>`,
held while the sandbox lives and dropped by the kernel if the process dies.
Allocation walks the range round-robin from a random offset, so a uid is reused
as late as possible.
"""

from __future__ import annotations

import fcntl
import os
import random
from pathlib import Path


class UidsExhaustedError(Exception):
    """Every uid of the range is held by a live sandbox."""


class UidAllocator:
    def __init__(self, base: int, count: int, lock_dir: Path) -> None:
        if count < 1:
            raise ValueError(f"bwrap.uid_count must be >= 1, got {count}")
        self._base, self._count = base, count
        self._lock_dir = lock_dir
        self._next = random.randrange(count)
        self._held: dict[int, int] = {}  # uid -> lock file descriptor

    def allocate(self) -> int:
        self._lock_dir.mkdir(parents=True, exist_ok=True)
        for _ in range(self._count):
            uid = self._base + self._next
            self._next = (self._next + 1) % self._count
            if uid in self._held:
                continue
            fd = os.open(self._lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self._held[uid] = fd
            return uid
        raise UidsExhaustedError(f"all {self._count} sandbox uids are in use; raise bwrap.uid_count")

    def release(self, uid: int) -> None:
        fd = self._held.pop(uid, None)
        if fd is not None:
            os.close(fd)  # closing drops the flock
