"""Starting the trainer's ranks with torchrun, and each rank tied to its torchrun (no torch import).

`torchrun_argv` / `torchrun_env`: what `rollstream train --ranks N` execs:
`python -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node=N
--max-restarts=R -m rollstream -- <train args>` with OMP_NUM_THREADS per rank (the `--`
keeps torchrun's parser off our options: it would take `--run` for its `--run-path`).
On several nodes, start torchrun by hand with its rendezvous options; the ranks are the same.

`die_with_torchrun` runs first thing in `python -m rollstream`, before the imports of torch
and the rest (seconds on a small machine). torchrun starts its workers in sessions of their
own, so a supervisor that SIGKILLs torchrun's process group (a hung rank found by its
heartbeat) does not reach them, and torchrun, killed, cannot stop them. In a torchrun
worker it asks the kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG; SIGKILL also
ends a SIGSTOPped process) and exits at once if the parent is already gone: not the
torchrun `rollstream train` exec'd (its pid, kept through the exec, in `TORCHRUN_PID_ENV`),
or, under a torchrun started by hand, no longer the parent it had a moment ago.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

TORCHRUN_ENV = "TORCHELASTIC_RUN_ID"  # set by torchrun (torch.distributed.run) for its workers
TORCHRUN_PID_ENV = "ROLLSTREAM_TORCHRUN_PID"  # set by `rollstream train` before it execs torchrun
_PR_SET_PDEATHSIG = 1


def launched_by_torchrun() -> bool:
    return TORCHRUN_ENV in os.environ and "WORLD_SIZE" in os.environ


def torchrun_argv(ranks: int, max_restarts: int, args: Sequence[str]) -> list[str]:
    """torchrun starting `ranks` ranks of `rollstream ARGS` on this machine, restarting the group up
    to `max_restarts` times after a rank fails."""
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={ranks}",
        f"--max-restarts={max_restarts}",
        "-m",
        "rollstream",
        "--",
        *args,
    ]


def torchrun_env(environ: dict[str, str], ranks: int, threads: int) -> dict[str, str]:
    """The environment for the torchrun this process execs into: OMP_NUM_THREADS per rank
    (`trainer.torch_threads`, else the machine's cores shared out) unless the caller set it, and
    this pid (torchrun's after the exec) for the ranks to check their parent against."""
    per_rank = threads or max(1, (os.cpu_count() or 1) // ranks)
    return {"OMP_NUM_THREADS": str(per_rank), **environ, TORCHRUN_PID_ENV: str(os.getpid())}


def die_with_torchrun() -> None:
    """In a torchrun worker: SIGKILL with the parent, exit now if it is gone (module docstring)."""
    if TORCHRUN_ENV not in os.environ or not sys.platform.startswith("linux"):
        return
    parent = int(os.environ.get(TORCHRUN_PID_ENV, "0")) or os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)
