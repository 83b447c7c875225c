"""Background processes with pid files: start detached, recognise our own process
(a pid file is stale when its pid is gone or now belongs to another program), stop
with SIGTERM then SIGKILL, check ports and read log tails. Used by the launchers and
the pipeline supervisor."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path


class LauncherError(RuntimeError):
    """A service could not be started or stopped; the message says why and what to do."""


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def process_cmdline(pid: int) -> str:
    """The command line of `pid` ('' when it is gone or a zombie)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""
    if status.rpartition(")")[2].split()[0] == "Z":
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def live_pid(pid_file: Path, marker: str) -> int | None:
    """The pid in `pid_file` if that process is alive and its command line contains
    `marker` (a pid reused by another program does not count); otherwise None."""
    pid = read_pid(pid_file)
    if pid is None:
        return None
    _reap(pid)
    return pid if marker in process_cmdline(pid) else None


def clear_stale(pid_file: Path, marker: str) -> bool:
    """Remove `pid_file` when its process is gone (killed broker); True if it was stale."""
    pid = read_pid(pid_file)
    if pid is None:
        if pid_file.exists():
            pid_file.unlink(missing_ok=True)
            return True
        return False
    cmdline = process_cmdline(pid)
    # An empty command line while the process lives is an exec in progress, not a stale file.
    if not is_running(pid) or (cmdline and marker not in cmdline):
        pid_file.unlink(missing_ok=True)
        return True
    return False


def start_detached(argv: Sequence[str], log_file: Path, pid_file: Path, cwd: Path) -> int:
    """Start `argv` in a new session (it survives the calling shell), output to `log_file`."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("ab") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    pid_file.write_text(f"{proc.pid}\n")
    return proc.pid


def _reap(pid: int) -> None:
    """Collect the exit status when `pid` is our child (so it does not linger as a zombie)."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def is_running(pid: int) -> bool:
    """Alive and not a zombie (the command line may read empty while a process execs)."""
    _reap(pid)
    try:
        status = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return status.rpartition(")")[2].split()[0] != "Z"


def stop_processes(pids: Sequence[int], grace_s: float) -> list[int]:
    """SIGTERM all of `pids` at once, wait up to `grace_s`, then SIGKILL the rest.
    Returns the pids that had to be killed."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_running(pid) for pid in pids):
        time.sleep(0.2)
    killed = [pid for pid in pids if is_running(pid)]
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(is_running(pid) for pid in killed) and time.monotonic() < deadline:
        time.sleep(0.1)
    return killed


def kill_now(pid: int) -> None:
    """SIGKILL (no shutdown hooks: what a crash looks like) and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while is_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def log_tail(log_file: Path, lines: int = 25) -> str:
    try:
        text = log_file.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock across processes (several test sessions may start a service at once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
