"""A supervisor for the pipeline's processes on one machine (engine, workers, sink).

Each process is `rollstream <args>` started with the same config file and
overrides, its output in `<state_dir>/runs/<run>/logs/<name>.log`. Children get
PR_SET_PDEATHSIG so they die with the supervisor even when it is SIGKILLed;
`stop()` sends SIGTERM, waits, then SIGKILL. A child that exits early is reported
with the tail of its log, never silently ignored.
"""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollstream.launcher.process import log_tail
from rollstream.supervisor import ProcessExitedError

__all__ = ["Pipeline", "ProcessExitedError"]  # `rollstream.supervisor.Supervisor` restarts; this does not

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Pipeline:
    log_dir: Path
    config_args: list[str] = field(default_factory=list)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = (self.log_dir / f"{name}.log").open("ab")
        command = [sys.executable, "-m", "rollstream", *args, *self.config_args]
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        log.close()
        self.processes[name] = process
        return process

    def check_alive(self) -> None:
        """Raise with the log tail of the first process that has exited."""
        for name, process in self.processes.items():
            if process.poll() is not None:
                log = self.log_dir / f"{name}.log"
                raise ProcessExitedError(
                    f"{name} exited with code {process.returncode}; last lines of its log "
                    f"({log}):\n{log_tail(log, lines=20)}"
                )

    def stop(self, timeout_s: float = 15.0) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes.values():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                process.wait(remaining)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
