"""A command's output kept within a byte limit, and its `ExecResult`.

Every backend reads a command's output as it comes and keeps, per stream, the
first and the last quarter of `output_limit_bytes` (so a test run's summary at the
end survives next to its start); the middle is counted and dropped, never
buffered, so a command printing gigabytes costs bandwidth, not memory.

Backends that run commands through an engine's exec (e2b, docker with
`channel = "engine"`) run each as `timeout -s KILL T sh -c CMD` (`timeout_argv`):
coreutils' timeout puts the command in its own process group and kills the whole
group, itself included, when T passes — so a timeout shows as exit 137 (or 124)
after at least T seconds, which `exec_result` classifies. Docker's exec helper keeps
head and tail itself, times commands out itself and says so; `kept_bytes` and
`classified_result` turn its report into the same `ExecResult`.
"""

from __future__ import annotations

from dataclasses import dataclass

from sandboxes.base import ExecResult

STDOUT, STDERR = 1, 2
TIMEOUT_EXIT, SIGKILL_EXIT, SIGXCPU_EXIT = 124, 128 + 9, 128 + 24
# A process cap makes fork() fail rather than kill, so it shows only in the error output.
PROCESS_MARKERS = (b"Cannot fork", b"can't fork", b"fork: retry", b"Resource temporarily unavailable")


@dataclass(frozen=True)
class ExecOutput:
    """What an exec printed, as kept (head and tail of each stream), and how much in all."""

    stdout: bytes
    stderr: bytes
    total_bytes: int
    truncated: bool


class StreamKeeper:
    """Keeps the first and the last `part` bytes of one stream; counts everything."""

    def __init__(self, part: int) -> None:
        self.part = part
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.part - len(self.head)
        if room > 0:
            self.head.extend(data[:room])
            data = data[room:]
        if data and self.part > 0:
            self.tail.extend(data[-self.part :])
            del self.tail[: max(0, len(self.tail) - self.part)]

    def kept(self) -> bytes:
        return kept_bytes(bytes(self.head), bytes(self.tail), self.total)


def kept_bytes(head: bytes, tail: bytes, total: int) -> bytes:
    """What is shown of a stream of `total` bytes of which `head` and `tail` were kept."""
    cut = total - len(head) - len(tail)
    if cut <= 0:
        return head + tail
    return head + f"\n[... {cut} bytes not kept ...]\n".encode() + tail


class OutputCollector:
    """Keeps at most `limit` bytes of output: head and tail, a quarter each, of stdout and stderr.

    Output past the limit is read and dropped, never buffered, so a command printing
    gigabytes costs bandwidth but not memory, and its exit code is still known.
    """

    def __init__(self, limit: int) -> None:
        self.streams = {STDOUT: StreamKeeper(limit // 4), STDERR: StreamKeeper(limit // 4)}

    def add(self, stream: int, data: bytes) -> None:
        self.streams.get(stream, self.streams[STDOUT]).add(data)

    def result(self) -> ExecOutput:
        out, err = self.streams[STDOUT], self.streams[STDERR]
        total = out.total + err.total
        kept = len(out.head) + len(out.tail) + len(err.head) + len(err.tail)
        return ExecOutput(out.kept(), err.kept(), total, total > kept)


def timeout_argv(command: str, limit_s: float) -> list[str]:
    """`sh -c command` under a wall-clock limit that kills its whole process group."""
    if limit_s <= 0:  # `timeout 0` would mean no limit at all
        raise ValueError(f"command timeout must be positive, got {limit_s}")
    return ["timeout", "-s", "KILL", f"{limit_s:.3f}", "sh", "-c", command]


def exec_result(code: int | None, output: OutputCollector, duration_s: float, limit_s: float) -> ExecResult:
    """The result of a command run under `timeout_argv`: a timeout, a kill, or its own exit."""
    timed_out = code in (TIMEOUT_EXIT, SIGKILL_EXIT) and duration_s >= limit_s * 0.98
    return classified_result(code, output.result(), duration_s, timed_out)


def classified_result(code: int | None, kept: ExecOutput, duration_s: float, timed_out: bool) -> ExecResult:
    """An `ExecResult` naming the limit that ended the command, if one did (`killed_reason`)."""
    return ExecResult(
        exit_code=code,
        stdout=kept.stdout.decode(errors="replace"),
        stderr=kept.stderr.decode(errors="replace"),
        duration_s=duration_s,
        timed_out=timed_out,
        output_bytes=kept.total_bytes,
        output_truncated=kept.truncated,
        killed_reason=killed_reason(code, timed_out, kept.stderr),
    )


def killed_reason(code: int | None, timed_out: bool, stderr: bytes) -> str | None:
    if timed_out:
        return "timeout"
    if code == SIGKILL_EXIT:
        return "memory"  # SIGKILL not sent by the command nor for a timeout: the cgroup's OOM killer
    if code == SIGXCPU_EXIT:
        return "cpu"
    if code != 0 and any(marker in stderr for marker in PROCESS_MARKERS):
        return "processes"  # a process cap makes fork() fail rather than kill
    return None
