"""The stream processor on recorded streams: expected groups, deadlines, weights, bad events."""

from __future__ import annotations

import random

from streams.eventgen import NS, AttemptSpec, group_events, synthetic_run, trajectory_events, weights_event
from streams.events import Event
from streams.outcomes import Outcome
from streams.payloads import GroupFormed, RolloutAbort, TrajectoryAssembled
from streams.processor import Emit, Output, Rejected, StreamProcessor
from streams.settings import PolicySettings

POLICY = PolicySettings(group_size=4)


def _specs(version: int = 0) -> list[AttemptSpec]:
    outcomes = [
        (Outcome.RESOLVED, 1.0),
        (Outcome.UNRESOLVED, 0.0),
        (Outcome.RESOLVED, 1.0),
        (Outcome.TRUNCATED_TURNS, 0.0),
    ]
    return [
        AttemptSpec(a, 0, 2 + a, o, r, version, group_size=4, start_s=a * 0.1)
        for a, (o, r) in enumerate(outcomes)
    ]


def _feed(processor: StreamProcessor, events: list[Event]) -> list[Output]:
    out: list[Output] = []
    for event in events:
        out += processor.feed(event)
    return out


def _groups(out: list[Output]) -> list[Event]:
    return [o.event for o in out if isinstance(o, Emit) and o.topic == "groups"]


def test_recorded_run_gives_one_group_per_task_whatever_the_order() -> None:
    events = synthetic_run("run", groups=12, group_size=4, seed=3)
    in_order = _feed(StreamProcessor(POLICY), events)
    messy = events + random.Random(5).sample(events, 200)
    random.Random(6).shuffle(messy)
    shuffled = _feed(StreamProcessor(POLICY), messy)
    expected = {e.id: e.data for e in _groups(in_order)}
    assert len(expected) == 12
    assert {e.id: e.data for e in _groups(shuffled)} == expected
    trajectories = [o.event for o in shuffled if isinstance(o, Emit) and o.topic == "trajectories"]
    assert len(trajectories) == len({e.trajectory_id for e in events}) == len({e.id for e in trajectories})
    for group in expected.values():
        assert isinstance(group, GroupFormed)
        assert group.policy.group_size == 4 and group.policy.overlong == "mask"


def test_missing_event_holds_the_group_until_it_arrives() -> None:
    events = group_events("run", "run/g0", _specs())
    hole = next(e for e in events if e.type == "tool.executed")
    processor = StreamProcessor(POLICY)
    out = _feed(processor, [e for e in events if e is not hole])
    assert _groups(out) == [] and "run/g0" in processor.groups
    late = processor.feed(hole)
    [group] = _groups(late)
    assert isinstance(group.data, GroupFormed) and group.data.rewards == [1.0, 0.0, 1.0, 0.0]
    assert group.data.loss_masked == [False, False, False, True]
    assert processor.groups == {} and processor.feed(hole) == []  # finished state deleted, late copy ignored


def test_malformed_events_are_rejected_and_the_group_still_forms() -> None:
    events = group_events("run", "run/g0", _specs())
    turn = next(e for e in events if e.type == "turn.generated" and e.trajectory_id == "run/g0/a1r0")
    bad = turn.model_copy(update={"data": turn.data.model_copy(update={"output_versions": []})})
    conflict = next(e for e in events if e.trajectory_id == "run/g0/a2r0" and e.seq == 3)
    twin = conflict.model_copy(update={"id": events[0].id})
    stream = [bad if e is turn else e for e in events]
    stream.insert(stream.index(conflict) + 1, twin)  # before a2 completes: a2 cannot be trusted
    out = _feed(StreamProcessor(POLICY), stream)
    rejected = [o for o in out if isinstance(o, Rejected)]
    assert any("versions" in r.reason for r in rejected)
    [conflicting] = [r for r in rejected if "two different events" in r.reason]
    assert conflicting.event is twin  # the record that showed the conflict is the one dead-lettered
    assert not [o for o in out if isinstance(o, Emit) and o.event.trajectory_id == "run/g0/a2r0"]
    assert _groups(out) == []  # a1 still waits for the turn that was rejected (a gap)
    # a1 never completes (its turn was rejected): the group is formed only by the deadline or end of log
    processor = StreamProcessor(POLICY)
    _feed(processor, [bad if e is turn else e for e in events])
    [group] = _groups(processor.finish_all())
    assert group.data.members == ["run/g0/a0r0", "run/g0/a2r0", "run/g0/a3r0"]


def test_deadline_aborts_stragglers_who_then_count_per_policy() -> None:
    t0 = 1_700_000_000 * NS
    policy = PolicySettings(group_size=4, group_deadline_s=30.0, abort_grace_s=10.0, overlong="zero")
    fast = [
        AttemptSpec(a, 0, 2, Outcome.RESOLVED if a else Outcome.UNRESOLVED, float(a > 0), group_size=4)
        for a in range(3)
    ]
    slow = trajectory_events(
        "run", "run/g0", AttemptSpec(3, 0, 40, Outcome.UNRESOLVED, 0.0, group_size=4), t0_ns=t0
    )
    processor = StreamProcessor(policy)
    _feed(processor, group_events("run", "run/g0", fast, t0_ns=t0) + slow[:5])
    assert processor.tick(t0 + 29 * NS) == []
    [abort] = processor.tick(t0 + 31 * NS)
    assert isinstance(abort, Emit) and abort.topic == "rollout.control"
    assert isinstance(abort.event.data, RolloutAbort) and abort.event.data.trajectory_ids == ["run/g0/a3r0"]
    assert processor.tick(t0 + 32 * NS) == []  # aborted once
    straggler = trajectory_events(
        "run", "run/g0", AttemptSpec(3, 0, 2, Outcome.TRUNCATED_DEADLINE, 1.0, group_size=4), t0_ns=t0
    )
    [traj, group] = _feed(processor, straggler)
    assert (
        isinstance(traj.event.data, TrajectoryAssembled) and traj.event.data.outcome == "truncated:deadline"
    )
    assert group.event.data.rewards == [0.0, 1.0, 1.0, 0.0]  # overlong=zero: the straggler counts as 0


def test_deadline_grace_forms_the_group_without_lost_stragglers() -> None:
    t0 = 1_700_000_000 * NS
    policy = PolicySettings(group_size=4, group_deadline_s=30.0, abort_grace_s=10.0)
    events = group_events("run", "run/g0", _specs()[:3], t0_ns=t0)
    lost = trajectory_events("run", "run/g0", AttemptSpec(3, 0, 5, group_size=4), t0_ns=t0)[:4]
    processor = StreamProcessor(policy)
    _feed(processor, events + lost)
    assert len(processor.tick(t0 + 31 * NS)) == 1
    [group] = processor.tick(t0 + 42 * NS)
    assert group.event.data.members == ["run/g0/a0r0", "run/g0/a1r0", "run/g0/a2r0"]
    assert processor.groups == {}


def test_staleness_follows_weights_by_event_time() -> None:
    t0 = 1_700_000_000 * NS
    events = group_events("run", "run/g0", _specs(version=1), t0_ns=t0)
    finished = max(e.time_ns for e in events)
    processor = StreamProcessor(POLICY)
    processor.observe_weights(weights_event("run", 9, finished + NS))  # after the group: not in force
    processor.observe_weights(weights_event("run", 5, finished - NS))
    [group] = _groups(_feed(processor, events))
    assert group.data.dropped is None and group.policy_version == 5
    processor = StreamProcessor(POLICY)
    processor.observe_weights(weights_event("run", 6, finished - NS))
    [group] = _groups(_feed(processor, events))
    assert group.data.dropped == "stale"


def test_emitted_ids_are_not_emitted_again() -> None:
    events = synthetic_run("run", groups=3, group_size=4, seed=1)
    first = StreamProcessor(POLICY)
    out = _feed(first, events)
    again = StreamProcessor(POLICY)
    again.emitted |= {o.event.id for o in out if isinstance(o, Emit)}
    assert _feed(again, events) == [] and again.groups == {}


def test_rerun_after_a_killed_worker_supersedes_its_partial_copy() -> None:
    """The killed run wrote more turns than the re-run will, under the same ids, with other samples:
    the trajectory emitted is the re-run's alone."""
    specs = _specs()
    killed = trajectory_events(
        "run", "run/g0", AttemptSpec(0, 0, 6, Outcome.RESOLVED, 1.0, 0, group_size=4), source="rollout-dead"
    )[:-2]
    rerun = trajectory_events("run", "run/g0", specs[0], source="rollout-1")
    others = [e for e in group_events("run", "run/g0", specs) if e.trajectory_id != rerun[0].trajectory_id]
    out = _feed(StreamProcessor(POLICY), killed + rerun + others)
    alone = _feed(StreamProcessor(POLICY), rerun + others)

    def trajectories(o: list[Output]) -> dict:
        return {e.id: e.data for e in (x.event for x in o if isinstance(x, Emit)) if e.type != "group.formed"}

    assert trajectories(out) == trajectories(alone)
    assert [e.data for e in _groups(out)] == [e.data for e in _groups(alone)]


def test_killed_copy_arriving_after_the_rerun_does_not_replace_it() -> None:
    """Copies interleaved (the re-run's events first, the killed run's late): the fold is the one
    `dedupe_by_seq` makes, the finishing run's copy, as replay of the same events gives."""
    specs = _specs()
    killed = trajectory_events(
        "run", "run/g0", AttemptSpec(0, 0, 6, Outcome.RESOLVED, 1.0, 0, group_size=4), source="rollout-dead"
    )[:-2]
    rerun = trajectory_events("run", "run/g0", specs[0], source="rollout-1")
    others = [e for e in group_events("run", "run/g0", specs) if e.trajectory_id != rerun[0].trajectory_id]
    out = _feed(StreamProcessor(POLICY), rerun[:-1] + killed + rerun[-1:] + others)
    alone = _feed(StreamProcessor(POLICY), rerun + others)

    def trajectories(o: list[Output]) -> dict:
        return {x.event.id: x.event.data for x in o if isinstance(x, Emit) and x.topic == "trajectories"}

    assert len(trajectories(alone)) == 4
    assert trajectories(out) == trajectories(alone)
