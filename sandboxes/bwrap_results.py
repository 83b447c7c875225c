"""Turning the bwrap exec server's replies into `ExecResult`s, and host-side file copies.

`killed_reason` names the limit that ended a command: `timeout` (the server
killed it), `cpu` / `file_size` (SIGXCPU / SIGXFSZ, seen on the command or as
the shell's 128+signal exit code), `killed` (SIGKILL), and `memory` /
`processes`, read from the command's error output, because RLIMIT_AS and
RLIMIT_NPROC make allocations and forks fail rather than kill.
"""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

from sandboxes.base import ExecResult
from sandboxes.output import PROCESS_MARKERS

MEMORY_MARKERS = (
    b"MemoryError",
    b"Cannot allocate memory",
    b"out of memory",
    b"bad_alloc",
    b"memory exhausted",
)


def copy_any(source: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, dest, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(source, dest)


def raise_transfer_error(reply: dict, what: str) -> None:
    """A failed upload/download is the caller's error (a missing path, no permission), not infra."""
    if "error" not in reply:
        return
    error = reply["error"]
    if error.startswith("FileNotFoundError"):
        raise FileNotFoundError(f"cannot {what}: {error}")
    raise OSError(f"cannot {what}: {error}")


def exec_result(reply: dict) -> ExecResult:
    exit_code = reply["exit_code"]
    if exit_code < 0:
        exit_code = 128 - exit_code  # killed by a signal: the shell's convention
    return ExecResult(
        exit_code=exit_code,
        stdout=reply["stdout"].decode(errors="replace"),
        stderr=reply["stderr"].decode(errors="replace"),
        duration_s=reply["duration_s"],
        timed_out=reply["timed_out"],
        output_bytes=reply["output_bytes"],
        output_truncated=reply["truncated"],
        killed_reason=killed_reason(reply),
    )


def killed_reason(reply: dict) -> str | None:
    """Which limit ended the command, if any (rlimit failures are read from its error output)."""
    if reply["timed_out"]:
        return "timeout"
    code = reply["exit_code"]
    if code == 0:
        return None
    died_of = -code if code < 0 else code - 128  # the command, or the shell reporting its child
    if died_of == signal.SIGXCPU:
        return "cpu"
    if died_of == signal.SIGXFSZ:
        return "file_size"
    if died_of == signal.SIGKILL:
        return "killed"
    stderr = reply["stderr"]
    if any(marker in stderr for marker in MEMORY_MARKERS):
        return "memory"
    if any(marker in stderr for marker in PROCESS_MARKERS):
        return "processes"
    return None
