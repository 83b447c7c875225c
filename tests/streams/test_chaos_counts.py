"""The counting of `bench chaos` (pure): lost, duplicated and re-run copies; infra errors that
reached a reward or a group; groups trained twice, skipped or out of order; versions; the
engine log's load lines; the seeded kill schedule."""

from __future__ import annotations

import itertools

import pytest

from bench.chaos_counts import (
    Assembled,
    Finish,
    GroupRecord,
    StepRecord,
    count_infra,
    count_training,
    count_trajectories,
    count_versions,
    kill_schedule,
    parse_engine_loads,
)


def fin(
    tid: str, eid: str = "", outcome: str = "resolved", reward: float | None = 1.0, injected: bool = False
):
    return Finish(tid, eid or f"e-{tid}", outcome, reward, injected)


def test_lost_duplicated_and_copies_are_told_apart() -> None:
    # a: a re-run's copy of one finish; b: two different finishes
    finishes = [fin("a"), fin("a"), fin("b"), fin("b", "e-b2"), fin("x")]
    counts = count_trajectories(["a", "b", "c", "a"], finishes)
    assert (counts.requested, counts.finished, counts.lost, counts.duplicated, counts.copies) == (
        3,
        2,
        1,
        1,
        1,
    )
    assert counts.lost_ids == ("c",)


def test_infra_errors_scored_anywhere_are_counted_once_each() -> None:
    finishes = [
        fin("ok"),
        fin("inj", outcome="infra_error:sandbox_start", reward=None, injected=True),
        fin("kill", outcome="infra_error:engine", reward=None),
        fin("bad", outcome="infra_error:timeout", reward=0.0, injected=True),
    ]
    clean = count_infra(
        finishes, [Assembled("ok", "t1", "resolved", 1.0)], [GroupRecord("g", "e", ("ok",), None)]
    )
    assert (clean.recorded, clean.injected, clean.injected_unrecorded, clean.scored) == (3, 2, 0, 1)
    leaked = count_infra(
        finishes,
        [Assembled("kill", "t2", "infra_error:engine", 0.0)],
        [GroupRecord("g", "e", ("ok", "inj", "bad"), None)],
    )
    assert leaked.scored == 3
    # finished twice (a re-run after a kill ended as an infra error): a duplicate, scored only when used
    twice = [fin("d", "e1", "unresolved", 0.0), fin("d", "e2", "infra_error:network", None)]
    member = [GroupRecord("g", "e", ("d",), None)]
    assert count_infra(twice, [Assembled("d", "t", "unresolved", 0.0)], member).scored == 0
    assert count_infra(twice, [Assembled("d", "t", "infra_error:network", None)], member).scored == 1
    assert count_infra(twice, [], member).scored == 0
    unrecorded = count_infra([fin("u", injected=True)], [], [])
    assert unrecorded.injected_unrecorded == 1


def groups(*spec: tuple[str, str | None]) -> list[GroupRecord]:
    return [GroupRecord(gid, f"e-{gid}", (), dropped) for gid, dropped in spec]


def test_every_kept_group_trained_once_in_offset_order() -> None:
    log = groups(("g1", None), ("g2", "zero_variance"), ("g3", None), ("g4", None), ("g5", None))
    steps = [
        StepRecord(1, "s1", ("g1", "g3")),
        StepRecord(1, "s1", ("g1", "g3")),
        StepRecord(2, "s2", ("g4",)),
    ]
    counts = count_training([*log, log[0]], steps)  # a group record read twice, a step re-written
    assert (counts.kept, counts.trained, counts.trained_twice, counts.skipped) == (4, 3, 0, 0)
    assert (counts.out_of_order, counts.untrained_tail, counts.step_conflicts, counts.groups_duplicated) == (
        0,
        1,
        0,
        0,
    )


def test_twice_skipped_out_of_order_and_conflicts_are_caught() -> None:
    log = groups(("g1", None), ("g2", None), ("g3", None), ("g4", None))
    steps = [
        StepRecord(1, "s1", ("g1", "g1")),
        StepRecord(2, "s2", ("g4", "g3")),
        StepRecord(2, "s2b", ("g3",)),
    ]
    counts = count_training([*log, GroupRecord("g2", "other", (), None)], steps)
    assert counts.trained_twice == 1
    assert counts.skipped == 1  # g2: kept, before the last trained group, never trained
    assert counts.out_of_order == 2  # g4 before g3
    assert counts.step_conflicts == 1
    assert counts.groups_duplicated == 1
    assert count_training(log, [StepRecord(1, "s", ("zz",))]).trained_not_kept == 1


def test_versions_and_engine_log_lines() -> None:
    log = (
        "2026 INFO engine: weight version 0 -> 2 of run r1 (/w/r1/2) in 0.10s\n"
        "weight version 2 -> 3 of run r2 (/w/r2/3) in 0.1s\nnoise\n"
        "engine: weight version 2 -> 4 of run r1 (/w/r1/4) in 0.2s\n"
    )
    loads = parse_engine_loads(log, "r1")
    assert loads == [2, 4]
    versions = count_versions([1, 2, 3, 4, 4], loads, [0, 2, 4])
    assert (versions.published, versions.loaded, versions.last_published, versions.last_loaded) == (
        4,
        2,
        4,
        4,
    )
    assert versions.generated == 3 and versions.loaded_unpublished == 0
    assert count_versions([1], [5], []).loaded_unpublished == 1


def test_kill_schedule_is_seeded_spread_and_never_twice_in_a_row() -> None:
    kills = [t for t in ("sink", "worker", "rollout", "trainer", "engine") for _ in range(2)] + ["broker"]
    one = kill_schedule(3, kills, 0.1, 0.8)
    assert one == kill_schedule(3, kills, 0.1, 0.8)
    assert one != kill_schedule(4, kills, 0.1, 0.8)
    assert sorted(k.target for k in one) == sorted(kills)
    assert one[0].at == 0.1 and one[-1].at == 0.8
    assert all(a.at < b.at and a.target != b.target for a, b in itertools.pairwise(one))
    with pytest.raises(ValueError):
        kill_schedule(0, kills, 0.9, 0.1)
