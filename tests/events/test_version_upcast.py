"""v1 rollout events (a made-up `policy_version` 0 until an episode's first generation) are read as v2:
None where the writer cannot have known the version, the recorded value where a generation set it.

A whole v1 episode, written the way v1 workers did, decodes to exactly the events a v2 worker writes
for it, on every decode path (reference, fast, the store's wire path)."""

from __future__ import annotations

import json

import pytest

from streams.eventgen import AttemptSpec, trajectory_events
from streams.events import Event, decode_event, encode_event
from streams.fast_decode import decode_event_fast
from streams.outcomes import Outcome
from streams.store.wire import decode_record


def as_v1(event: Event, version: int) -> bytes:
    raw = json.loads(encode_event(event))
    return json.dumps({**raw, "schema_version": 1, "policy_version": version}).encode()


def v1_episode(events: list[Event]) -> list[bytes]:
    """The records a v1 worker wrote for this episode: 0 until its first generation, then the
    highest version its generations reported."""
    records, version = [], 0
    for event in events:
        if event.type == "turn.generated":
            version = max(version, event.data.weight_version)  # type: ignore[attr-defined]
        records.append(as_v1(event, version))
    return records


def episode(outcome: Outcome, turns: int, version: int) -> list[Event]:
    reward = 1.0 if outcome == Outcome.RESOLVED else None if outcome.is_infra_error else 0.0
    spec = AttemptSpec(0, 0, turns, outcome, reward, version, group_size=4)
    return trajectory_events("run", "run/g0", spec)


@pytest.mark.parametrize(
    ("outcome", "turns", "version"),
    [
        (Outcome.RESOLVED, 3, 7),
        (Outcome.INFRA_SANDBOX_START, 0, 5),  # never generated: no version anywhere
        (Outcome.INFRA_VERIFIER, 2, 4),
    ],
)
def test_a_v1_episode_reads_as_the_v2_worker_writes_it(outcome: Outcome, turns: int, version: int) -> None:
    v2 = episode(outcome, turns, version)
    for record, expected in zip(v1_episode(v2), v2, strict=True):
        for decode in (decode_event, decode_event_fast, lambda value: decode_record(value)[0]):
            read = decode(record)
            assert (read.type, read.schema_version, read.policy_version) == (
                expected.type,
                expected.schema_version,
                expected.policy_version,
            )
        assert decode_event(record) == expected


@pytest.mark.parametrize(
    ("kind", "written", "read"),
    [
        ("trajectory.started", 0, None),
        ("sandbox.requested", 0, None),
        ("sandbox.ready", 0, None),
        ("turn.generated", 0, 0),
        ("turn.generated", 6, 6),
        ("tool.executed", 0, 0),
        ("tests.ran", 6, 6),
        ("tests.ran", 0, None),  # 0 after no generation, or a real version 0: not known
        ("sandbox.released", 0, None),
        ("sandbox.failed", 3, 3),
    ],
)
def test_each_v1_rollout_type_has_a_defined_reading(kind: str, written: int, read: int | None) -> None:
    event = next(
        e
        for e in episode(Outcome.RESOLVED, 2, 6) + episode(Outcome.INFRA_SANDBOX_LOST, 0, 6)
        if e.type == kind
    )
    assert decode_event(as_v1(event, written)).policy_version == read


def test_a_v1_episode_on_version_0_keeps_the_0_its_generations_set() -> None:
    """Where the v1 0 may be made up (events that come with or without a generation before them),
    it reads as not known; where a generation set it, it stays."""
    v2 = episode(Outcome.UNRESOLVED, 2, 0)
    read = [decode_event(record) for record in v1_episode(v2)]
    ambiguous = {"tests.ran", "sandbox.released"}
    assert [e.policy_version for e in read] == [None if e.type in ambiguous else e.policy_version for e in v2]
    assert [e.policy_version for e in read if e.type in ("turn.generated", "trajectory.finished")] == [
        0,
        0,
        0,
    ]


def test_a_v1_finish_has_a_version_only_after_a_turn() -> None:
    after_turns = next(e for e in episode(Outcome.RESOLVED, 2, 6) if e.type == "trajectory.finished")
    without = next(e for e in episode(Outcome.INFRA_SANDBOX_START, 0, 6) if e.type == "trajectory.finished")
    assert decode_event(as_v1(after_turns, 0)).policy_version == 0
    assert decode_event(as_v1(after_turns, 6)).policy_version == 6
    assert decode_event(as_v1(without, 0)).policy_version is None
