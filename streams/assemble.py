"""Folding one trajectory's rollout events into a `Trajectory` (pure: no Kafka, SQL or clock).

`fold_trajectory(events)` takes the events of one trajectory in any order, with
duplicates (same event id: the first copy wins), and returns:

- a `Trajectory` once `trajectory.started` (seq 0) through `trajectory.finished`
  (seq `last_seq`) are all present;
- a `Pending` that says what is still missing otherwise (a gap waits for the
  missing event; nothing is guessed);
- raises `MalformedTrajectory` when the events cannot belong to one episode
  (two trajectory ids, a turn whose logprobs do not match its tokens, a finished
  event with the wrong `last_seq`, ...).

Token layout of the result: the prompt, then per turn the observation tokens
(new prompt tokens since the last turn, loss mask 0) and the output tokens (loss
mask 1, with the engine's logprob and weight version of each token). Prompt and
observation tokens carry logprob 0.0 and version -1. The arrays are `array.array`s
(int32 ids and versions, int8 mask, float64 logprobs), like the payloads' (`streams.packed`).
`prompt_tokens` counts the context before the first output (a gateway session's prompt
arrives as turn 1's observation).

A turn with a `drift` (a gateway client changed its history, `HistoryDrift`) first cuts the
arrays back to `drift.offset` tokens, then appends its observation (the re-rendered rest, mask
0) and output: the trajectory is the last context the engine saw, every token the policy
generated in that very context keeps its mask, and tokens it generated in a context that is
gone (or that were re-tokenised from a client's messages) are not trained on. Turn records
whose output was cut away are dropped; `turns` still counts every call.

`check_event(event)` is the per-event half of the same validation, so a stream
worker can dead-letter one bad event without waiting for its trajectory.
"""

from __future__ import annotations

import dataclasses
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any, Protocol, TypeVar

from streams.events import ROLLOUT_EVENT_TYPES, Event
from streams.outcomes import Outcome
from streams.packed import empty
from streams.payloads import (
    Limits,
    SandboxReady,
    TestsRan,
    TimeBreakdown,
    ToolExecuted,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
)

PROMPT_VERSION = -1


class MalformedTrajectory(ValueError):
    """Events that cannot be folded into one episode; `reason` says which and why."""

    def __init__(self, trajectory_id: str | None, reason: str) -> None:
        super().__init__(f"trajectory {trajectory_id}: {reason}")
        self.trajectory_id = trajectory_id
        self.reason = reason


@dataclass(frozen=True)
class TurnRecord:
    """One turn's place in the token arrays plus the tool call it led to (for SFT messages)."""

    turn: int
    observation_start: int
    output_start: int
    output_end: int
    command: str | None
    tool_output: str | None
    finish_reason: str


@dataclass(frozen=True)
class Trajectory:
    run_id: str
    group_id: str
    trajectory_id: str
    task_id: str
    attempt: int
    retry: int
    group_size: int
    limits: Limits
    outcome: Outcome
    reward: float | None
    error: str | None
    token_ids: array[int]  # int32
    loss_mask: array[int]  # int8
    rollout_logprobs: array[float]  # float64
    token_versions: array[int]  # int32
    prompt_tokens: int
    turns: int
    generated_tokens: int
    context_tokens: int
    times: TimeBreakdown
    started_ns: int
    finished_ns: int
    oldest_version: int | None  # of its generated tokens; None when it generated none
    newest_version: int | None
    turn_records: tuple[TurnRecord, ...] = field(default=())
    history_drifts: int = 0  # turns whose context a gateway client changed (see the module docstring)

    @property
    def is_scored(self) -> bool:
        return self.outcome.is_scored

    @property
    def duration_s(self) -> float:
        return (self.finished_ns - self.started_ns) / 1e9


@dataclass(frozen=True)
class Pending:
    """Not foldable yet: which seqs are missing (`last_seq` None = not finished yet)."""

    trajectory_id: str
    received: int
    missing: tuple[int, ...]
    last_seq: int | None

    @property
    def reason(self) -> str:
        if self.last_seq is None:
            return f"{self.received} events, trajectory.finished not seen yet"
        return f"waiting for seq {list(self.missing[:5])} of 0..{self.last_seq}"


def check_event(event: Event) -> str | None:
    """Why this single rollout event can never be folded, or None when it is fine."""
    if event.type not in ROLLOUT_EVENT_TYPES:
        return f"{event.type} is not a rollout event"
    if not event.trajectory_id or not event.group_id:
        return f"{event.type} seq {event.seq} has no trajectory_id or group_id"
    data = event.data
    if isinstance(data, TurnGenerated):
        n = len(data.output_token_ids)
        if len(data.output_logprobs) != n or len(data.output_versions) != n:
            return (
                f"turn {data.turn} has {n} output tokens but {len(data.output_logprobs)} logprobs "
                f"and {len(data.output_versions)} versions"
            )
    if isinstance(data, TrajectoryStarted) and event.seq != 0:
        return f"trajectory.started has seq {event.seq}, expected 0"
    if isinstance(data, TrajectoryFinished) and data.last_seq != event.seq:
        return f"trajectory.finished has seq {event.seq} but last_seq {data.last_seq}"
    return None


class EventCopy(Protocol):
    """What `dedupe_by_seq` reads of an event: an `Event`, or the store's `WireEvent` (same envelope)."""

    @property
    def id(self) -> Any: ...
    @property
    def seq(self) -> int: ...
    @property
    def source(self) -> str: ...
    @property
    def trajectory_id(self) -> str | None: ...
    @property
    def data(self) -> Any: ...


CopyT = TypeVar("CopyT", bound=EventCopy)


def dedupe_by_seq(events: Iterable[CopyT]) -> dict[int, CopyT]:
    """One event per seq, indexed by seq; two different ids at one seq is malformed.

    A rollout worker killed mid-episode leaves a partial copy that the re-run
    overwrites under the same ids, but sampling may differ between the two runs.
    The copy written by the worker that finished the trajectory (the source of
    the first `trajectory.finished`) wins at every seq, and the killed run's
    events past the finished one are dropped, so two runs are never mixed.
    The stream processor, replay and the SQL store's projections (`streams.store.writer`) all
    choose with this function.
    """
    events = list(events)
    finished = next((e for e in events if isinstance(e.data, TrajectoryFinished)), None)
    finisher = finished.source if finished is not None else None
    by_seq: dict[int, CopyT] = {}
    for event in events:
        seen = by_seq.get(event.seq)
        if seen is None:
            by_seq[event.seq] = event
        elif seen.id != event.id:
            raise MalformedTrajectory(
                event.trajectory_id, f"two different events {seen.id} and {event.id} at seq {event.seq}"
            )
        elif finisher is not None and seen.source != finisher and event.source == finisher:
            by_seq[event.seq] = event
    if finished is not None:
        last = finished.seq
        by_seq = {seq: e for seq, e in by_seq.items() if seq <= last or e.source == finisher}
    return by_seq


def fold_trajectory(events: Iterable[Event], *, checked: bool = False) -> Trajectory | Pending:
    """The trajectory of these events, or what it still waits for.

    `checked=True`: every event already passed `check_event` (the stream processor checks on arrival).
    """
    by_seq = dedupe_by_seq(events)
    if not by_seq:
        raise MalformedTrajectory(None, "no events")
    first = next(iter(by_seq.values()))
    trajectory_id = first.trajectory_id or ""
    for event in by_seq.values():
        if event.trajectory_id != first.trajectory_id or event.group_id != first.group_id:
            raise MalformedTrajectory(
                trajectory_id, f"event seq {event.seq} belongs to {event.trajectory_id}"
            )
        reason = None if checked else check_event(event)
        if reason:
            raise MalformedTrajectory(trajectory_id, reason)
    last_seq = next((e.seq for e in by_seq.values() if isinstance(e.data, TrajectoryFinished)), None)
    if last_seq is None:
        return Pending(trajectory_id, len(by_seq), (), None)
    if max(by_seq) > last_seq:
        raise MalformedTrajectory(
            trajectory_id, f"event seq {max(by_seq)} after trajectory.finished {last_seq}"
        )
    missing = tuple(s for s in range(last_seq + 1) if s not in by_seq)
    if missing:
        return Pending(trajectory_id, len(by_seq), missing, last_seq)
    return _build([by_seq[s] for s in range(last_seq + 1)])


@dataclass
class _Arrays:
    """The trajectory's token arrays, grown turn by turn (`extend` of same-type arrays is a copy)."""

    token_ids: array[int] = field(default_factory=empty("i"))
    loss_mask: array[int] = field(default_factory=empty("b"))
    logprobs: array[float] = field(default_factory=empty("d"))
    versions: array[int] = field(default_factory=empty("i"))

    def add_context(self, ids: Sequence[int]) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend(repeat(0, len(ids)))
        self.logprobs.extend(repeat(0.0, len(ids)))
        self.versions.extend(repeat(PROMPT_VERSION, len(ids)))

    def add_output(self, turn: TurnGenerated) -> None:
        self.token_ids.extend(turn.output_token_ids)
        self.loss_mask.extend(repeat(1, len(turn.output_token_ids)))
        self.logprobs.extend(turn.output_logprobs)
        self.versions.extend(turn.output_versions)

    def cut(self, length: int) -> None:
        """Keep the first `length` tokens (a drift: what followed them left the context)."""
        for values in (self.token_ids, self.loss_mask, self.logprobs, self.versions):
            del values[length:]


@dataclass
class _Times:
    llm_s: float = 0.0
    tool_s: float = 0.0
    sandbox_start_s: float = 0.0
    tests_s: float = 0.0
    queue_s: float = 0.0

    def add(self, event: Event) -> None:
        data = event.data
        if isinstance(data, TurnGenerated):
            self.llm_s += data.latency_s
            self.queue_s += data.queue_wait_s
        elif isinstance(data, ToolExecuted):
            self.tool_s += data.duration_s
        elif isinstance(data, SandboxReady):
            self.sandbox_start_s += data.start_s
            self.queue_s += data.queue_wait_s
        elif isinstance(data, TestsRan):
            self.tests_s += data.duration_s

    def breakdown(self, agent_install_s: float, total_s: float) -> TimeBreakdown:
        return TimeBreakdown(
            llm_s=self.llm_s,
            tool_s=self.tool_s,
            sandbox_start_s=self.sandbox_start_s,
            agent_install_s=agent_install_s,
            tests_s=self.tests_s,
            queue_s=self.queue_s,
            total_s=max(0.0, total_s),
        )


@dataclass
class _Turns:
    """The turns folded so far: token arrays, per-turn records and the versions of output tokens."""

    trajectory_id: str | None
    arrays: _Arrays = field(default_factory=_Arrays)
    records: list[TurnRecord] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    count: int = 0  # turns folded (records cut away by a drift included)
    drifts: int = 0
    first_output: int | None = None  # where the first output kept starts: the prompt's length

    def add(self, data: object) -> None:
        if isinstance(data, TurnGenerated):
            if data.turn != self.count + 1:
                raise MalformedTrajectory(self.trajectory_id, f"turn {data.turn} follows turn {self.count}")
            self.count += 1
            if data.drift is not None:
                self._cut(data.drift.offset)
            observation_start = len(self.arrays.token_ids)
            self.arrays.add_context(data.observation_token_ids)
            output_start = len(self.arrays.token_ids)
            self.arrays.add_output(data)
            self.versions += data.output_versions or [data.weight_version]
            end = len(self.arrays.token_ids)
            self.first_output = output_start if self.first_output is None else self.first_output
            self.records.append(
                TurnRecord(data.turn, observation_start, output_start, end, None, None, data.finish_reason)
            )
        elif isinstance(data, ToolExecuted) and self.records and self.records[-1].turn == data.turn:
            last = self.records[-1]
            self.records[-1] = dataclasses.replace(last, command=data.command, tool_output=data.output)

    def _cut(self, offset: int) -> None:
        length = len(self.arrays.token_ids)
        if offset > length:
            reason = f"turn {self.count}'s drift keeps {offset} tokens of a {length}-token context"
            raise MalformedTrajectory(self.trajectory_id, reason)
        self.drifts += 1
        self.arrays.cut(offset)
        self.records = [r for r in self.records if r.output_end <= offset]
        if self.first_output is not None and self.first_output >= offset:
            self.first_output = self.records[0].output_start if self.records else None


def _build(events: list[Event]) -> Trajectory:
    """Fold a complete, gap-free, validated list of events (seq 0..last)."""
    start, end = events[0], events[-1]
    started, finished = start.data, end.data
    if not isinstance(started, TrajectoryStarted) or not isinstance(finished, TrajectoryFinished):
        raise MalformedTrajectory(start.trajectory_id, "seq 0 must be trajectory.started")
    turns, times = _Turns(start.trajectory_id), _Times()
    turns.arrays.add_context(started.prompt_token_ids)
    for event in events[1:-1]:
        times.add(event)
        turns.add(event.data)
    arrays = turns.arrays
    prompt_tokens = turns.first_output if turns.first_output is not None else len(arrays.token_ids)
    return Trajectory(
        run_id=start.run_id,
        group_id=start.group_id or "",
        trajectory_id=start.trajectory_id or "",
        task_id=start.task_id or "",
        attempt=started.attempt,
        retry=started.retry,
        group_size=started.group_size,
        limits=started.limits,
        outcome=finished.outcome,
        reward=None if finished.outcome.is_infra_error else finished.reward,
        error=finished.error,
        token_ids=arrays.token_ids,
        loss_mask=arrays.loss_mask,
        rollout_logprobs=arrays.logprobs,
        token_versions=arrays.versions,
        prompt_tokens=prompt_tokens,
        turns=turns.count,
        generated_tokens=sum(arrays.loss_mask),
        context_tokens=len(arrays.token_ids),
        times=times.breakdown(finished.times.agent_install_s, (end.time_ns - start.time_ns) / 1e9),
        started_ns=start.time_ns,
        finished_ns=end.time_ns,
        oldest_version=min(turns.versions, default=None),
        newest_version=max(turns.versions, default=None),
        turn_records=tuple(turns.records),
        history_drifts=turns.drifts,
    )
