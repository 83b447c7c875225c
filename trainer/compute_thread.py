"""The one thread that runs a trainer process's torch work.

Measured on SmolLM2-135M (bf16 autocast, LoRA 16, 2 cores; `bench trainer --model`): once a
second thread has run torch's parallel kernels in a process, every step runs 2-2.5x slower for
the rest of that process, on either thread (an `rl_step` of 8.3 s on the thread that had done
all the work took 16-21 s after another thread ran one; the same steps on one thread stayed at
8-10 s; `OMP_WAIT_POLICY=PASSIVE` did not help). The trainer had loaded its model on the main
thread and stepped in `asyncio.to_thread` workers, so it paid that on every step.

So a trainer process builds, loads, steps, snapshots and checkpoints its model here and nowhere
else: `run_on_compute(fn, ...)` from synchronous code, `await on_compute(fn, ...)` from the event
loop (which stays free for the heartbeat and Kafka). Work already on this thread runs inline.
Writing a version file and hashing it are not torch work and run beside it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
THREAD_NAME = "torch-compute"
_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)


def on_compute_thread() -> bool:
    return threading.current_thread().name.startswith(THREAD_NAME)


def run_on_compute(work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run `work` on the compute thread and return its result (its exception is raised here)."""
    if on_compute_thread():
        return work(*args, **kwargs)
    return _executor.submit(work, *args, **kwargs).result()


async def on_compute(work: Callable[..., T], *args: Any) -> T:
    """`run_on_compute` for the event loop: the loop keeps running while the work does."""
    if on_compute_thread():
        return work(*args)
    return await asyncio.get_running_loop().run_in_executor(_executor, work, *args)
