"""The pipeline's supervisor: named `rollstream` processes, restarted when they die or hang.

    sup = Supervisor(log_dir, config_args, cfg.supervisor)
    with sup:                                   # stop() on exit: TERM, wait, KILL
        sup.start("worker", ["worker"])         # `python -m rollstream worker <config_args>`
        ...
        sup.check_alive()                       # raises ProcessExitedError once one was given up
        sup.status()                            # [ProcessStatus]: pid, state, restarts, beat age

Each child runs `rollstream <args> <config_args>` in its own process group, output
appended to `<log_dir>/<name>.log`, with PR_SET_PDEATHSIG (it gets SIGTERM when the
supervisor dies, even by SIGKILL) and a heartbeat file `<log_dir>/<name>.heartbeat`
named in its environment (`streams.heartbeat`). A watcher thread checks every
`health_interval_s`: a child that exited, or whose heartbeat is older than
`hung_after_s` (none yet `startup_grace_s` after its start), is SIGKILLed with its
process group and restarted after an exponential backoff (`backoff_s` doubling up to
`backoff_max_s`). A run of `healthy_after_s` resets the backoff; past `max_restarts`
consecutive restarts the child is given up (state `failed`) and `check_alive` raises.
Every restart is logged to the child's log and to `<log_dir>/supervisor.log`.
A child started with `ranks=N` > 1 (the data-parallel trainer: torchrun and its N ranks)
is as old as its stalest running rank: each rank beats `<name>.heartbeat.rank<r>`, and a
hung rank is found while the others beat on (a rank that exited is not judged: torchrun
restarts or ends the group); ages count from the group's last (re)start
(`<name>.heartbeat.start`, touched by each rank as it starts), so a group torchrun
restarted gets the startup grace again. SIGKILL of torchrun's group takes its ranks
too: they die with their parent (`trainer.torchrun.die_with_torchrun`).

`stop()` stops the children in reverse start order, each before the next is signalled:
SIGTERM to the child alone (a rollout worker drains its episodes), up to `stop_timeout_s`
for it to exit, then SIGKILL to what is left of its group. What started later may use
what started earlier (a rollout worker, the engine it calls): a worker draining while its
engine stopped recorded the engine's abort of its request as an infrastructure error.
Children ignore the terminal's Ctrl-C (their own group): the caller handles SIGINT/SIGTERM
and calls `stop()`.

`Supervisor(..., restart=False)` is the same runner for processes that must not outlive a
failure (an evaluation's engine, a benchmark's or a test's processes): nothing is restarted and
no heartbeat is watched; a child that exits is given up at once, and `check_alive` raises with
the tail of its log the moment it is asked. It is the one process runner of Rollstream.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from rollstream.launcher.process import KILL_WAIT_S, log_tail
from rollstream.supervisor_settings import SupervisorSettings
from streams.heartbeat import (
    HEARTBEAT_FILE_ENV,
    HEARTBEAT_INTERVAL_ENV,
    beat_age_s,
    beat_pid,
    rank_file,
    start_file,
)

_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded here, not in the forked child
logger = logging.getLogger(__name__)


class ProcessExitedError(RuntimeError):
    """A pipeline process ended while it should be running (and is not restarted)."""


class State(StrEnum):
    RUNNING = "running"
    BACKOFF = "backoff"  # exited or hung; restarts when its backoff is over
    FAILED = "failed"  # given up after max_restarts
    STOPPED = "stopped"
    DONE = "done"  # a process started with `completes=True` that exited 0: its work is finished


@dataclass(frozen=True)
class ProcessStatus:
    """One process in a supervisor's snapshot (what a live view renders)."""

    name: str
    pid: int | None
    state: State
    restarts: int
    last_exit: int | None
    heartbeat_age_s: float | None  # None: no beat since its start (or not expected)
    uptime_s: float
    last_reason: str  # why it was last restarted ('' = never)


@dataclass
class _Child:
    name: str
    args: list[str]
    heartbeat: bool
    popen: subprocess.Popen[bytes]
    started_at: float  # unix time: heartbeats older than this belong to an earlier run
    started_mono: float
    state: State = State.RUNNING
    restarts: int = 0
    consecutive: int = 0
    last_exit: int | None = None
    reason: str = ""
    restart_at: float = 0.0
    completes: bool = False
    ranks: int = 1  # processes beating under this name (torchrun's ranks)


def _die_with_parent() -> None:
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _running(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Supervisor:
    def __init__(
        self,
        log_dir: Path,
        config_args: list[str] | None = None,
        settings: SupervisorSettings | None = None,
        *,
        env: dict[str, str] | None = None,
        restart: bool = True,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.restart = restart
        self.config_args = list(config_args or [])
        self.settings = settings or SupervisorSettings()
        self._env = dict(env if env is not None else os.environ)
        self._children: dict[str, _Child] = {}
        self._lock = threading.RLock()
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    # ---- what callers use ----
    def start(
        self, name: str, args: list[str], *, heartbeat: bool = True, completes: bool = False, ranks: int = 1
    ) -> subprocess.Popen[bytes]:
        """Start `rollstream <args>` as `name` and supervise it (`heartbeat=False`: exits only;
        `completes=True`: an exit with code 0 means its work is done, e.g. `train --steps N`,
        and it is not restarted; `ranks`: how many ranks beat under this name, see above)."""
        with self._lock:
            if name in self._children:
                raise ValueError(f"a process named {name!r} is already supervised")
            self._children[name] = self._spawn(name, args, heartbeat and self.restart)
            self._children[name].completes = completes
            self._children[name].ranks = ranks
            self._note(name, f"started (pid {self._children[name].popen.pid}): rollstream {' '.join(args)}")
        if self._watcher is None:
            self._watcher = threading.Thread(target=self._watch, name="supervisor", daemon=True)
            self._watcher.start()
        return self._children[name].popen

    @property
    def processes(self) -> dict[str, subprocess.Popen[bytes]]:
        with self._lock:
            return {name: child.popen for name, child in self._children.items()}

    def done(self, name: str) -> bool:
        """Whether `name` (started with `completes=True`) has exited 0."""
        with self._lock:
            return self._children[name].state is State.DONE

    def check_alive(self) -> None:
        """Raise with the log tail of the first process that was given up (without restarts: of the
        first that exited, seen now rather than at the watcher's next pass)."""
        with self._lock:
            if not self.restart:
                self.check_once()
            for child in self._children.values():
                if child.state is State.FAILED:
                    log = self.log_dir / f"{child.name}.log"
                    what = f"was given up after {child.restarts} restarts ({child.reason})"
                    raise ProcessExitedError(
                        f"{child.name} {what if self.restart else child.reason}; "
                        f"last lines of its log ({log}):\n{log_tail(log, lines=20)}"
                    )

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop watching; then, latest started first, SIGTERM each child, wait for it (up to the
        timeout, then SIGKILL) and SIGKILL what is left in its group."""
        self._stopping.set()
        if self._watcher is not None and self._watcher is not threading.current_thread():
            self._watcher.join()
        timeout = self.settings.stop_timeout_s if timeout_s is None else timeout_s
        with self._lock:
            for child in reversed(self._children.values()):
                self._stop_child(child, timeout)

    def _stop_child(self, child: _Child, timeout: float) -> None:
        if child.popen.poll() is None:
            child.popen.send_signal(signal.SIGTERM)
        try:
            child.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self._note(child.name, f"did not exit within {timeout:.0f} s of SIGTERM: SIGKILL")
            _killpg(child.popen.pid, signal.SIGKILL)
            child.popen.wait()
        _killpg(child.popen.pid, signal.SIGKILL)  # whatever it left in its group
        if child.state not in (State.FAILED, State.DONE):
            child.state = State.STOPPED
        child.last_exit = child.popen.returncode

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- the snapshot ----
    def status(self) -> list[ProcessStatus]:
        now = time.monotonic()
        with self._lock:
            return [self._status(child, now) for child in self._children.values()]

    def _status(self, child: _Child, now: float) -> ProcessStatus:
        alive = child.state is State.RUNNING
        age = self._beat_age(child)[0] if alive and child.heartbeat else None
        return ProcessStatus(
            name=child.name,
            pid=child.popen.pid if alive else None,
            state=child.state,
            restarts=child.restarts,
            last_exit=child.last_exit,
            heartbeat_age_s=age,
            uptime_s=now - child.started_mono if alive else 0.0,
            last_reason=child.reason,
        )

    # ---- the watcher ----
    def _watch(self) -> None:
        while not self._stopping.wait(self.settings.health_interval_s):
            try:
                self.check_once()
            except Exception:  # the watcher must outlive any one bad check
                logger.exception("supervisor check failed")

    def check_once(self) -> None:
        """One health pass: restart children whose backoff is over; put dead or hung ones in backoff."""
        with self._lock:
            if self._stopping.is_set():
                return
            now = time.monotonic()
            for child in self._children.values():
                if child.state is State.RUNNING and child.completes and child.popen.poll() == 0:
                    child.state, child.last_exit, child.reason = State.DONE, 0, "finished"
                    self._note(child.name, "finished (exit 0)")
                elif child.state is State.RUNNING:
                    reason = self._trouble(child)
                    if reason:
                        self._fail(child, reason, now)
                elif child.state is State.BACKOFF and now >= child.restart_at:
                    self._restart(child)

    def _trouble(self, child: _Child) -> str:
        """Why `child` must be restarted now ('' = it is fine)."""
        code = child.popen.poll()
        if code is not None:
            return f"exited with code {code}"
        if not child.heartbeat:
            return ""
        age, since, who = self._beat_age(child)
        if age is None:
            waited = time.time() - since
            if waited > self.settings.startup_grace_s:
                return f"hung: no heartbeat{who} {waited:.0f} s after its start"
            return ""
        if age > self.settings.hung_after_s:
            return f"hung: last heartbeat{who} {age:.0f} s ago"
        return ""

    def _beat_age(self, child: _Child) -> tuple[float | None, float, str]:
        """(age of the child's stalest beat, None while one is missing; the unix time ages count
        from; which rank, for messages)."""
        base = self._beat_file(child.name)
        if child.ranks == 1:
            return beat_age_s(base, child.started_at), child.started_at, ""
        since = max(child.started_at, _mtime(start_file(base)))
        ages: dict[int, float] = {}
        for rank in range(child.ranks):
            file = rank_file(base, rank)
            age = beat_age_s(file, since)
            if age is None:
                return None, since, f" of rank {rank}"
            if _running(beat_pid(file)):  # a rank that exited is torchrun's to restart, not a hang
                ages[rank] = age
        if not ages:
            return None, max(since, *(_mtime(rank_file(base, r)) for r in range(child.ranks))), ""
        stalest = max(ages, key=lambda rank: ages[rank])
        return ages[stalest], since, f" of rank {stalest}"

    def _fail(self, child: _Child, reason: str, now: float) -> None:
        _killpg(child.popen.pid, signal.SIGKILL)  # a hung (even stopped) child and what it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.popen.wait(timeout=KILL_WAIT_S)
        child.last_exit = child.popen.returncode
        child.reason = reason
        if now - child.started_mono >= self.settings.healthy_after_s:
            child.consecutive = 0
        child.consecutive += 1
        if not self.restart:
            child.state = State.FAILED
            self._note(child.name, f"{reason}; not restarted")
            return
        limit = self.settings.max_restarts
        if limit and child.consecutive > limit:
            child.state = State.FAILED
            self._note(child.name, f"{reason}; given up after {limit} consecutive restarts")
            return
        delay = min(self.settings.backoff_max_s, self.settings.backoff_s * 2 ** (child.consecutive - 1))
        child.state = State.BACKOFF
        child.restart_at = now + delay
        self._note(child.name, f"{reason}; restart {child.restarts + 1} in {delay:.1f} s")

    def _restart(self, child: _Child) -> None:
        fresh = self._spawn(child.name, child.args, child.heartbeat)
        child.popen, child.started_at, child.started_mono = fresh.popen, fresh.started_at, fresh.started_mono
        child.state = State.RUNNING
        child.restarts += 1
        self._note(child.name, f"restart {child.restarts}: started (pid {child.popen.pid})")

    # ---- processes and logs ----
    def _beat_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.heartbeat"

    def _spawn(self, name: str, args: list[str], heartbeat: bool) -> _Child:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {**self._env, "PYTHONUNBUFFERED": "1"}
        if heartbeat:
            env[HEARTBEAT_FILE_ENV] = str(self._beat_file(name))
            env[HEARTBEAT_INTERVAL_ENV] = str(self.settings.heartbeat_interval_s)
        command = [sys.executable, "-m", "rollstream", *args, *self.config_args]
        started_at = time.time()
        with (self.log_dir / f"{name}.log").open("ab") as log:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                process_group=0,
                preexec_fn=_die_with_parent,
            )
        return _Child(name, list(args), heartbeat, popen, started_at, time.monotonic())

    def _note(self, name: str, message: str) -> None:
        line = f"{time.strftime('%Y-%m-%dT%H:%M:%S')} [supervisor] {name}: {message}\n"
        logger.info("%s: %s", name, message)
        for path in (self.log_dir / f"{name}.log", self.log_dir / "supervisor.log"):
            try:
                with path.open("a") as handle:
                    handle.write(line)
            except OSError:
                logger.warning("cannot write %s", path)
