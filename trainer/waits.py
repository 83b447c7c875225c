"""What the trainer waited for while it collected a step's batch (`StepTimes`'s wait split).

A `WaitClock` starts when the collection of a step's batch begins. The loop marks the time it
spends fetching `groups` while no next group is there (`waiting_for("groups")`: the rollouts of
the next group are still running, or were not requested yet) and reading `trajectories` until
a formed group's members are in (`waiting_for("trajectories")`); the rest of the wait is
reading and judging records. `finish()` adds the machine's CPU use over the whole wait: the
share of every core's time that was busy (rollouts, the engine, anything else on the machine)
while the trainer itself mostly sat in a poll. Near 1, the rollouts are bound by the CPU they
share with everything else, and more rollout concurrency would not shorten the wait.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import psutil

WaitingFor = Literal["groups", "trajectories"]


@dataclass(frozen=True)
class CpuSample:
    busy_s: float  # every core's non-idle time since boot
    total_s: float

    @classmethod
    def now(cls) -> CpuSample:
        """Busy: user, nice, system, irq, softirq, steal (guest time is already in user on Linux).
        Idle without iowait: Linux's iowait counter can go down between two reads."""
        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + sum(getattr(t, name, 0.0) for name in ("irq", "softirq", "steal"))
        return cls(busy, busy + t.idle)


@dataclass(frozen=True)
class WaitSplit:
    wait_s: float
    groups_s: float
    trajectories_s: float
    cpu_busy: float | None  # None: no CPU time passed (too short to measure)


@dataclass
class WaitClock:
    clock: Callable[[], float] = time.monotonic
    cpu: Callable[[], CpuSample] = CpuSample.now
    spent: dict[WaitingFor, float] = field(default_factory=lambda: {"groups": 0.0, "trajectories": 0.0})

    def __post_init__(self) -> None:
        self.started = self.clock()
        self.cpu_start = self.cpu()

    @contextlib.contextmanager
    def waiting_for(self, what: WaitingFor) -> Iterator[None]:
        began = self.clock()
        try:
            yield
        finally:
            self.spent[what] += self.clock() - began

    def finish(self) -> WaitSplit:
        cpu = self.cpu()
        total = cpu.total_s - self.cpu_start.total_s
        busy = (cpu.busy_s - self.cpu_start.busy_s) / total if total > 0 else None
        return WaitSplit(
            wait_s=self.clock() - self.started,
            groups_s=self.spent["groups"],
            trajectories_s=self.spent["trajectories"],
            cpu_busy=None if busy is None else min(max(busy, 0.0), 1.0),
        )


# ---- what a run's trainer waited for, in words (the live view and the report) -------------

WAIT_BOUND_SHARE = 0.2  # below this share of step time in waits, the trainer's own work binds
CPU_BOUND = 0.9  # a machine this busy while the trainer waits: rollouts are bound by the CPU
SLOTS_FULL = 0.9  # rollouts in flight at this share of the slots: the slots bind


@dataclass(frozen=True)
class WaitSummary:
    """Trainer steps' waits, summed: what the waits were for and what ran meanwhile."""

    steps: int
    step_s: float
    wait_s: float
    groups_s: float
    trajectories_s: float
    cpu_busy: float | None  # wait-weighted mean over the steps that recorded it
    in_flight: float | None = None  # mean rollouts in flight while the trainer waited (None: unknown)
    slots: int | None = None  # episode slots of the rollout workers (None: unknown)

    @property
    def share(self) -> float:
        return self.wait_s / self.step_s if self.step_s > 0 else 0.0

    @property
    def split(self) -> bool:
        """Whether the steps recorded what they waited for (records before that hold only wait_s)."""
        return self.cpu_busy is not None or self.groups_s + self.trajectories_s > 0


def summarise_waits(
    times: Sequence[Mapping[str, float | None]], in_flight: float | None = None, slots: int | None = None
) -> WaitSummary:
    """`times`: each step's `StepTimes` as a dict (old records lack the split)."""

    def total(key: str) -> float:
        return sum(float(t.get(key) or 0.0) for t in times)

    recorded = [(float(t.get("wait_s") or 0.0), t.get("wait_cpu_busy")) for t in times]
    weighted = [(w, float(busy)) for w, busy in recorded if busy is not None]
    weight = sum(w for w, _ in weighted)
    cpu = sum(w * busy for w, busy in weighted) / weight if weight > 0 else None
    return WaitSummary(
        len(times),
        total("total_s"),
        total("wait_s"),
        total("wait_groups_s"),
        total("wait_trajectories_s"),
        cpu,
        in_flight,
        slots,
    )


def wait_reason(w: WaitSummary) -> str:
    """What bound the trainer, in a sentence a user can act on."""
    if w.steps == 0:
        return "no trainer steps yet"
    share = f"the trainer waited {w.share:.0%} of its step time"
    if w.share < WAIT_BOUND_SHARE:
        return f"{share}: its own work (update, publish) binds"
    if not w.split:
        return f"{share} (written before the trainer recorded what for)"
    if w.trajectories_s > w.groups_s:
        return f"{share}, mostly for trajectories of formed groups not read yet (the stream worker's lag)"
    running = f"{w.in_flight:.1f} rollouts in flight" if w.in_flight is not None else "rollouts in flight"
    of_slots = f" of {w.slots} slots" if w.slots else ""
    if w.cpu_busy is not None and w.cpu_busy >= CPU_BOUND:
        return (
            f"{share}, mostly for groups not formed yet, with the CPU {w.cpu_busy:.0%} busy ({running}"
            f"{of_slots}): the rollouts are bound by the CPU they share, not by a concurrency cap"
        )
    if w.slots and w.in_flight is not None and w.in_flight >= SLOTS_FULL * w.slots:
        return (
            f"{share}, mostly for groups not formed yet, every rollout slot busy ({running}{of_slots}): "
            "rollout.concurrency binds (or a cap behind it: see the cap waits)"
        )
    cpu = f", the CPU {w.cpu_busy:.0%} busy" if w.cpu_busy is not None else ""
    return (
        f"{share}, mostly for groups not formed yet ({running}{of_slots}{cpu}): too few groups in "
        "flight (groups requested ahead), or a cap behind the rollouts (see the cap waits)"
    )


def mean_in_flight(
    spans: Sequence[tuple[int, int | None]], windows: Sequence[tuple[int, int]]
) -> float | None:
    """Time-weighted mean of trajectories running over the `windows` (ns); a span without an end
    still runs. None when the windows have no length."""
    length = sum(max(b - a, 0) for a, b in windows)
    if length <= 0:
        return None
    overlap = 0
    for a, b in windows:
        for start, end in spans:
            stop = b if end is None else min(end, b)
            overlap += max(stop - max(start, a), 0)
    return overlap / length
