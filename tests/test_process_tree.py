"""The tests' process watcher (`tests.process_tree.LeakWatch`) names children by what they exec."""

from __future__ import annotations

import os
import subprocess
import time

from tests.process_tree import LeakWatch


def test_a_child_first_seen_before_its_exec_is_named_by_the_program_it_becomes() -> None:
    watch = LeakWatch(every_s=0.05)
    watch.follow(os.getpid())
    # the child sits between fork and exec (a copy of this process) long enough to be sampled
    child = subprocess.Popen(["sleep", "1.5"], preexec_fn=lambda: time.sleep(0.5))
    try:
        time.sleep(1.2)
    finally:
        watch.stop()
        child.kill()
        child.wait()
    names = [c for c in watch.descendants() if c.split(" ", 1)[0].endswith("sleep")]
    assert names == ["sleep 1.5"], watch.descendants()
