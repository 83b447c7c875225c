"""The stream processor: rollout events in, trajectory / group / abort records out (pure).

`StreamProcessor` is the state machine that the stream worker, replay and the
benchmarks drive. It holds in-flight groups (their trajectories' events, folded
trajectories, attempts given up), and:

- `feed(event)` takes one rollout event and returns the records it causes: a
  `trajectories` record when a trajectory folds, a `groups` record when its group
  is complete, and `Rejected` for an event that can never be folded (the caller
  dead-letters it);
- `observe_weights(event)` follows `WeightsPublished` records; the latest weight
  version for a group is the newest one published at or before the group's last
  `trajectory.finished` (event time), so the worker and replay agree;
- `tick(now_ns)` applies the group deadline with a clock the caller owns: past
  `group_deadline_s` after a group's first `trajectory.started`, a `RolloutAbort`
  for its unfinished trajectories goes to `rollout.control`; `abort_grace_s` after
  that, the group is formed from what has finished;
- `finish_all()` forms every open group from what it has (replay at end of log).

Output ids are deterministic (`trajectory:<id>`, `group:<id>`, `abort:<id>`), so a
re-run emits the same records; ids in `emitted` are never emitted again, and a
group whose record id is there is treated as closed (its events are ignored).
"""

from __future__ import annotations

import bisect
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import chain

from streams.assemble import MalformedTrajectory, Pending, Trajectory, check_event, fold_trajectory
from streams.events import Event, event_id, make_event
from streams.groups import GroupResult, attempts_waiting, form_group
from streams.payloads import (
    GroupFormed,
    Limits,
    RolloutAbort,
    TrajectoryAssembled,
    TrajectoryStarted,
    WeightsPublished,
)
from streams.settings import PolicySettings

NS = 1_000_000_000


@dataclass(frozen=True)
class Emit:
    topic: str
    event: Event


@dataclass(frozen=True)
class Rejected:
    """An event that can never be folded; the caller dead-letters it."""

    event: Event
    reason: str


Output = Emit | Rejected


def group_record_id(group_id: str) -> uuid.UUID:
    return event_id(f"group:{group_id}", 0)


@dataclass
class _GroupState:
    run_id: str
    group_id: str
    task_id: str
    # per trajectory, by seq, every distinct copy in arrival order (one per source); which copy
    # folds is `dedupe_by_seq`'s rule, applied by `fold_trajectory`
    events: dict[str, dict[int, list[Event]]] = field(default_factory=dict)
    bad: set[str] = field(default_factory=set)  # malformed trajectories: later events are ignored
    attempts: dict[str, int] = field(default_factory=dict)
    done: dict[str, Trajectory] = field(default_factory=dict)
    settled: set[int] = field(default_factory=set)
    last_seq: dict[str, int] = field(default_factory=dict)
    started_ns: int | None = None
    aborted_ns: int | None = None

    def unfinished(self) -> list[str]:
        return sorted(t for t in self.events if t not in self.done)


class StreamProcessor:
    def __init__(self, policy: PolicySettings, *, source: str = "streams", closed_memory: int = 200_000):
        self.policy = policy
        self.source = source
        self.groups: dict[str, _GroupState] = {}
        self.emitted: set[uuid.UUID] = set()
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._closed_memory = closed_memory
        self._weights: dict[str, list[tuple[int, int]]] = {}

    # ---- input -------------------------------------------------------------------

    def feed(self, event: Event) -> list[Output]:
        reason = check_event(event)
        if reason:
            return [Rejected(event, reason)]
        group_id, trajectory_id = event.group_id or "", event.trajectory_id or ""
        if group_id in self._closed:
            return []
        state = self.groups.get(group_id)
        if state is None:
            if group_record_id(group_id) in self.emitted:
                self._close(group_id)
                return []
            state = self.groups[group_id] = _GroupState(event.run_id, group_id, event.task_id or "")
        if trajectory_id in state.done or trajectory_id in state.bad:
            return []
        copies = state.events.setdefault(trajectory_id, {}).setdefault(event.seq, [])
        if copies:  # a copy (same id), or a conflicting event at the same seq
            if copies[0].id != event.id:
                reason = f"two different events {copies[0].id} and {event.id} at seq {event.seq}"
                return self._give_up(state, trajectory_id, reason, event)
            if any(copy.source == event.source for copy in copies):
                return []
            # Otherwise a re-run after its worker was killed: both copies are kept and the fold
            # picks one by `dedupe_by_seq`'s rule (the finishing run's copy wins).
        copies.append(event)
        if isinstance(event.data, TrajectoryStarted):
            state.attempts[trajectory_id] = event.data.attempt
            if state.started_ns is None or event.time_ns < state.started_ns:
                state.started_ns = event.time_ns
        elif event.type == "trajectory.finished":
            state.last_seq.setdefault(trajectory_id, event.seq)  # the first finish, as `dedupe_by_seq`
        return self._maybe_fold(state, trajectory_id, event)

    def _maybe_fold(self, state: _GroupState, trajectory_id: str, event: Event) -> list[Output]:
        last_seq = state.last_seq.get(trajectory_id)
        bucket = state.events[trajectory_id]
        if last_seq is None or any(seq not in bucket for seq in range(last_seq + 1)):
            return []  # not finished, or a gap: wait for the missing events
        return self._try_fold(state, trajectory_id, event)

    def observe_weights(self, event: Event) -> None:
        if not isinstance(event.data, WeightsPublished):
            return
        timeline = self._weights.setdefault(event.run_id, [])
        entry = (event.time_ns, event.data.version)
        if entry not in timeline:
            bisect.insort(timeline, entry)

    def latest_version(self, run_id: str, at_ns: int) -> int:
        """Newest weight version published for `run_id` at or before `at_ns`; -1 if none."""
        timeline = self._weights.get(run_id, [])
        index = bisect.bisect_right(timeline, (at_ns, 1 << 62))
        return max((v for _, v in timeline[:index]), default=-1)

    # ---- clock-driven and end-of-log -------------------------------------------------

    def tick(self, now_ns: int) -> list[Output]:
        """Group deadline: abort stragglers, then after the grace form without them."""
        deadline_ns = int(self.policy.group_deadline_s * NS)
        if deadline_ns <= 0:
            return []
        out: list[Output] = []
        for state in list(self.groups.values()):
            if state.started_ns is None or now_ns - state.started_ns < deadline_ns:
                continue
            if state.aborted_ns is None:
                state.aborted_ns = now_ns
                out += self._abort(state, now_ns)
            elif now_ns - state.aborted_ns >= int(self.policy.abort_grace_s * NS):
                out += self._form(state)
        return out

    def finish_all(self) -> list[Output]:
        out: list[Output] = []
        for state in list(self.groups.values()):
            out += self._form(state)
        return out

    def forget(self, group_ids: set[str]) -> None:
        """Drop state of groups this worker no longer owns (partitions revoked)."""
        for group_id in group_ids:
            self.groups.pop(group_id, None)

    # ---- internals ---------------------------------------------------------------

    def _try_fold(self, state: _GroupState, trajectory_id: str, trigger: Event) -> list[Output]:
        copies = state.events[trajectory_id].values()
        try:
            folded = fold_trajectory(chain.from_iterable(copies), checked=True)
        except MalformedTrajectory as error:
            return self._give_up(state, trajectory_id, error.reason, trigger)
        if isinstance(folded, Pending):
            return []
        state.done[trajectory_id] = folded
        out = self._emit(self.trajectory_event(folded))
        if not attempts_waiting(list(state.done.values()), self.policy, state.settled):
            out += self._form(state)
        return out

    def _give_up(self, state: _GroupState, trajectory_id: str, reason: str, trigger: Event) -> list[Output]:
        """A malformed trajectory: reject the event that showed it, settle its attempt as not valid."""
        state.events.pop(trajectory_id, None)
        state.bad.add(trajectory_id)
        attempt = state.attempts.get(trajectory_id)
        if attempt is not None:
            state.settled.add(attempt)
        out: list[Output] = [Rejected(trigger, f"malformed trajectory: {reason}")]
        if state.done and not attempts_waiting(list(state.done.values()), self.policy, state.settled):
            out += self._form(state)
        return out

    def _abort(self, state: _GroupState, now_ns: int) -> list[Output]:
        stragglers = state.unfinished()
        if not stragglers:
            return []
        abort = make_event(
            RolloutAbort(trajectory_ids=stragglers, reason="group_deadline"),
            run_id=state.run_id,
            seq=0,
            time_ns=now_ns,
            source=self.source,
            group_id=state.group_id,
            task_id=state.task_id,
            id_key=f"abort:{state.group_id}",
        )
        return self._emit(Emit("rollout.control", abort))

    def _form(self, state: _GroupState) -> list[Output]:
        self.groups.pop(state.group_id, None)
        self._close(state.group_id)
        members = sorted(state.done.values(), key=lambda t: (t.attempt, t.retry))
        if not members:
            return []  # nothing ever finished: no group to write
        finished_ns = max(t.finished_ns for t in members)
        result = form_group(members, self.policy, self.latest_version(state.run_id, finished_ns))
        return self._emit(self.group_event(result, members[0].limits))

    def _emit(self, emit: Emit) -> list[Output]:
        if emit.event.id in self.emitted:
            return []
        self.emitted.add(emit.event.id)
        return [emit]

    def _close(self, group_id: str) -> None:
        self._closed[group_id] = None
        while len(self._closed) > self._closed_memory:
            self._closed.popitem(last=False)

    # ---- records -----------------------------------------------------------------

    def trajectory_event(self, trajectory: Trajectory) -> Emit:
        policy = policy_in_force(self.policy, trajectory.limits)
        # built without re-validating: every field comes from a validated fold, and validating the
        # token arrays again was a tenth of the worker's time (bench streams)
        data = TrajectoryAssembled.model_construct(
            attempt=trajectory.attempt,
            retry=trajectory.retry,
            outcome=trajectory.outcome,
            reward=trajectory.reward,
            token_ids=trajectory.token_ids,
            loss_mask=trajectory.loss_mask,
            rollout_logprobs=trajectory.rollout_logprobs,
            token_versions=trajectory.token_versions,
            prompt_tokens=trajectory.prompt_tokens,
            turns=trajectory.turns,
            generated_tokens=trajectory.generated_tokens,
            context_tokens=trajectory.context_tokens,
            times=trajectory.times,
            policy=policy,
            history_drifts=trajectory.history_drifts,
        )
        event = make_event(
            data,
            run_id=trajectory.run_id,
            seq=0,
            time_ns=trajectory.finished_ns,
            source=self.source,
            group_id=trajectory.group_id,
            trajectory_id=trajectory.trajectory_id,
            task_id=trajectory.task_id,
            policy_version=trajectory.newest_version,
            id_key=f"trajectory:{trajectory.trajectory_id}",
        )
        return Emit("trajectories", event)

    def group_event(self, result: GroupResult, limits: Limits) -> Emit:
        """The `groups` record; its policy is the group policy with the episodes' length limits in force."""
        data = GroupFormed(
            members=[t.trajectory_id for t in result.members],
            rewards=list(result.rewards),
            advantages=list(result.advantages),
            loss_masked=list(result.loss_masked),
            dropped=result.dropped,
            infra_errors=result.infra_errors,
            oldest_version=max(result.oldest_version, 0),
            policy=policy_in_force(result.policy, limits),
        )
        event = make_event(
            data,
            run_id=result.run_id,
            seq=0,
            time_ns=result.finished_ns,
            source=self.source,
            group_id=result.group_id,
            task_id=result.task_id,
            policy_version=result.latest_version if result.latest_version >= 0 else None,
            id_key=f"group:{result.group_id}",
        )
        return Emit("groups", event)


def policy_in_force(policy: PolicySettings, limits: Limits) -> PolicySettings:
    """The policy recorded on trajectories and groups: `policy` with the episode's length `limits`
    (the limits an episode ran under win over the worker's own, which may have changed since)."""
    return policy.model_copy(update=limits.model_dump())
