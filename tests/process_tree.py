"""Leak checks for commands that start processes (`rollstream up`, `rollstream demo`).

    watch = LeakWatch()                              # a unique tag for the environment
    proc = subprocess.Popen(cmd, env=watch.env)      # every descendant inherits the tag
    watch.follow(proc.pid)                           # records its process tree while it runs
    ...
    proc.wait(); watch.stop()
    watch.assert_none_left()                         # nothing it started still runs

A process counts as started by the command when it was seen in the command's process
tree (sampled every `every_s` by a thread, so an orphan reparented to init is still
known), or when its environment carries the tag (descendants that were never sampled).
A process is "left" when it still runs (not a zombie) with the same pid and creation
time; sandboxes that clear their environment are caught by the tree only.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid

import psutil

TAG_ENV = "ROLLSTREAM_LEAK_TAG"


class LeakWatch:
    def __init__(self, every_s: float = 0.2) -> None:
        self.tag = uuid.uuid4().hex
        self.env = {**os.environ, TAG_ENV: self.tag}
        self.every_s = every_s
        self.seen: dict[tuple[int, float], str] = {}  # (pid, create time) -> command line
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._before: set[tuple[int, float]] = set()

    def follow(self, root_pid: int) -> None:
        """Sample `root_pid`'s descendants until `stop()`. Those it already has are not the
        command's (following the test process itself: a session's podman service, say)."""
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(root_pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    self._before.add((child.pid, child.create_time()))
        self._thread = threading.Thread(target=self._sample, args=(root_pid,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _sample(self, root_pid: int) -> None:
        while not self._stop.is_set():
            self.record(root_pid)
            self._stop.wait(self.every_s)

    def record(self, root_pid: int) -> None:
        """Add `root_pid`'s current descendants to `seen`, with the command line each has now.

        A child first sampled between fork and exec still shows its parent's command line,
        and exec keeps the pid and create time: so every sample rewrites it (CI once saw a
        supervised sink only as a copy of pytest), except with an empty one: a process that is
        exiting has released its memory, and with it the command line psutil reads, before it
        is a zombie (CI later saw the sink missing again; this window is the likely cause)."""
        try:
            children = psutil.Process(root_pid).children(recursive=True)
        except psutil.Error:
            return
        for child in children:
            with contextlib.suppress(psutil.Error):
                key = (child.pid, child.create_time())
                if key in self._before:
                    continue
                cmdline = " ".join(child.cmdline())[:200]
                if cmdline or key not in self.seen:
                    self.seen[key] = cmdline

    def descendants(self) -> list[str]:
        return list(self.seen.values())

    def left(self) -> list[str]:
        """Command lines of processes the command started that still run."""
        out = []
        for (pid, created), cmdline in self.seen.items():
            if _running(pid, created):
                out.append(f"{pid}: {cmdline}")
        for process in psutil.process_iter(["pid", "environ", "cmdline", "create_time"]):
            with contextlib.suppress(psutil.Error):
                env = process.info["environ"] or {}
                key = (process.pid, process.info["create_time"])
                if env.get(TAG_ENV) == self.tag and key not in self.seen and _running(*key):
                    out.append(f"{process.pid} (tagged): {' '.join(process.info['cmdline'] or [])[:200]}")
        return out

    def assert_none_left(self, grace_s: float = 5.0) -> None:
        """Fail, naming them, when processes the command started outlive it by `grace_s`."""
        deadline = time.monotonic() + grace_s
        while (left := self.left()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, "processes left running:\n" + "\n".join(left)


def _running(pid: int, created: float) -> bool:
    try:
        process = psutil.Process(pid)
        return process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
