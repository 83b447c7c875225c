"""Background processes with pid files: start detached, recognise our own process
(a pid file is stale when its pid is gone or now belongs to another program), stop
with SIGTERM then SIGKILL, check ports and read log tails. Used by the launchers and
the pipeline supervisor. Process inspection and signals go through `psutil`; a zombie
counts as gone (our own children are reaped on the way)."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

KILL_WAIT_S = 10.0  # after SIGKILL the kernel frees a process at once; this only bounds a stuck exit
# `free_port` picks from here to the start of the ephemeral range: above the default ports
# of the broker (single and cluster), PostgreSQL and the monitor, skipping the engines'
FREE_PORT_MIN = 20000
RESERVED_PORTS = ((30000, 30100),)
_RANDOM = random.SystemRandom()  # two processes picking at once should not walk the same sequence


class LauncherError(RuntimeError):
    """A service could not be started or stopped; the message says why and what to do."""


def read_pid(pid_file: Path) -> int | None:
    try:
        return int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def _process(pid: int) -> psutil.Process | None:
    """`pid` as a psutil process, or None when there is no such process (or it is not ours to see)."""
    try:
        return psutil.Process(pid)
    except (psutil.Error, ValueError):  # ValueError: a negative pid from a corrupt pid file
        return None


def process_cmdline(pid: int) -> str:
    """The command line of `pid` ('' when it is gone or a zombie)."""
    process = _process(pid)
    if process is None:
        return ""
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return ""
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


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
    process = _process(pid)
    if process is not None:
        with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
            process.wait(timeout=0)  # reaps a dead child; for anything else, returns or times out now


def is_running(pid: int) -> bool:
    """Alive and not a zombie (the command line may read empty while a process execs)."""
    _reap(pid)
    process = _process(pid)
    if process is None:
        return False
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _wait_gone(pids: Sequence[int], timeout_s: float, every_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_running(pid) for pid in pids):
        time.sleep(every_s)


def _signal(pid: int, *, kill: bool) -> None:
    """SIGKILL (`kill`) or SIGTERM to `pid`; a process already gone is fine."""
    process = _process(pid)
    if process is None:
        return
    with contextlib.suppress(psutil.NoSuchProcess):
        if kill:
            process.kill()
        else:
            process.terminate()


def stop_processes(pids: Sequence[int], grace_s: float) -> list[int]:
    """SIGTERM all of `pids` at once, wait up to `grace_s`, then SIGKILL the rest.
    Returns the pids that had to be killed."""
    for pid in pids:
        _signal(pid, kill=False)
    _wait_gone(pids, grace_s, every_s=0.2)
    killed = [pid for pid in pids if is_running(pid)]
    for pid in killed:
        _signal(pid, kill=True)
    _wait_gone(killed, KILL_WAIT_S, every_s=0.1)
    return killed


def kill_now(pid: int) -> None:
    """SIGKILL (no shutdown hooks: what a crash looks like) and wait until it is gone."""
    _signal(pid, kill=True)
    _wait_gone([pid], KILL_WAIT_S, every_s=0.05)


def free_port(host: str = "127.0.0.1") -> int:
    """A port that no socket holds now, below the kernel's ephemeral range.

    A port the OS picks with bind(0) is an ephemeral one, and until the server that is
    handed it binds, any outgoing connection on the machine (a Kafka client's) may be
    given the same local port, and that server then fails with EADDRINUSE (the likely
    cause of a CI run whose monitor never served /metrics). Ports below the ephemeral range are never
    handed out that way. Random, so that two processes picking at once rarely meet.
    """
    low = _ephemeral_low()
    candidates = [p for p in range(FREE_PORT_MIN, low) if not any(a <= p < b for a, b in RESERVED_PORTS)]
    for port in _RANDOM.sample(candidates, min(len(candidates), 200)):
        if _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # a machine with no room below
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _ephemeral_low(range_file: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


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
