"""Replay, what-if, tail figures and datasets over recorded streams (no broker needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from streams.assemble import Trajectory, fold_trajectory
from streams.datasets import DatasetError, rl_rows, sft_rows, trajectory_rows, write_rows
from streams.eventgen import AttemptSpec, group_events, synthetic_run, trajectory_events, weights_event
from streams.outcomes import Outcome
from streams.payloads import Limits
from streams.policies import cut_limits, explicit_policy_keys, replay_policy, truncate_events
from streams.processor import Emit, StreamProcessor
from streams.replay import RecordedRun, by_trajectory, compare, replay
from streams.settings import PolicySettings
from streams.tail import tail_figures, tail_share
from streams.whatif import what_if

POLICY = PolicySettings(group_size=4, max_staleness=-1)


def _recorded(groups: int = 10, seed: int = 2) -> RecordedRun:
    """A run as a stream worker recorded it: events, weights, and its trajectories and groups."""
    events = synthetic_run("run", groups=groups, group_size=4, seed=seed, max_turns=12)
    processor = StreamProcessor(POLICY, source="worker-7")
    weights = [weights_event("run", 0, events[0].time_ns)]
    processor.observe_weights(weights[0])
    out = [o for e in events for o in processor.feed(e) if isinstance(o, Emit)]
    return RecordedRun(
        "run",
        events,
        weights,
        [o.event for o in out if o.topic == "trajectories"],
        [o.event for o in out if o.topic == "groups"],
    )


def test_replay_with_recorded_policy_reproduces_the_recorded_topics() -> None:
    run = _recorded()
    policy = replay_policy(run.recorded_policy(), PolicySettings(), set())
    # the recorded policy wins over the config's defaults; its length limits are the episodes'
    assert policy == POLICY.model_copy(update={"max_turns": 12})
    result = replay(run, policy)
    assert compare(run.trajectories, result.trajectories, "trajectories") == []
    assert compare(run.groups, result.groups, "groups") == []
    other = replay(run, policy.model_copy(update={"normalise_std": False}))
    assert any("advantages" in d for d in compare(run.groups, other.groups, "groups"))


def test_replay_of_a_rerun_after_a_killed_worker_keeps_the_reruns_copy() -> None:
    """As the live processor (test_processor.py): the killed run's partial copy, under the same ids
    with other samples, is superseded by the re-run's; replay folds and emits the re-run's tokens."""
    outcomes = [
        (Outcome.RESOLVED, 1.0),
        (Outcome.UNRESOLVED, 0.0),
        (Outcome.RESOLVED, 1.0),
        (Outcome.TRUNCATED_TURNS, 0.0),
    ]
    specs = [
        AttemptSpec(a, 0, 2 + a, o, r, 0, group_size=4, start_s=a * 0.1) for a, (o, r) in enumerate(outcomes)
    ]
    killed = trajectory_events(
        "run", "run/g0", AttemptSpec(0, 0, 6, Outcome.RESOLVED, 1.0, 0, group_size=4), source="rollout-dead"
    )[:-2]
    rerun = trajectory_events("run", "run/g0", specs[0], source="rollout-1")
    others = [e for e in group_events("run", "run/g0", specs) if e.trajectory_id != rerun[0].trajectory_id]
    events = killed + rerun + others
    live = StreamProcessor(POLICY)
    out = [o for e in events for o in live.feed(e) if isinstance(o, Emit)]
    result = replay(RecordedRun("run", events), POLICY)
    expected = fold_trajectory(killed + rerun)
    assert isinstance(expected, Trajectory) and expected == fold_trajectory(rerun)
    folded = {t.trajectory_id: t for t in result.folded}
    assert folded[expected.trajectory_id] == expected
    assert {e.id: e.data for e in result.trajectories} == {
        o.event.id: o.event.data for o in out if o.topic == "trajectories"
    }
    assert [e.data for e in result.groups] == [o.event.data for o in out if o.topic == "groups"]
    assert (len(result.trajectories), len(result.groups)) == (4, 1)
    cut = Limits(max_turns=1)  # what-if cuts the re-run's copy, never a mix of the two
    alone = replay(RecordedRun("run", rerun + others), POLICY, cut)
    assert replay(RecordedRun("run", events), POLICY, cut).folded == alone.folded


def test_explicit_keys_override_the_recorded_policy() -> None:
    keys = explicit_policy_keys(["policy.max_turns=40", "kafka.bootstrap=x", "policy.overlong=drop"])
    assert keys == {"max_turns", "overlong"}
    merged = replay_policy(
        PolicySettings(group_size=4, max_turns=80), PolicySettings(max_turns=40, overlong="drop"), keys
    )
    assert (merged.group_size, merged.max_turns, merged.overlong) == (4, 40, "drop")
    assert cut_limits(merged, keys) == Limits(max_turns=40)
    assert cut_limits(merged, {"overlong"}) is None


def test_truncate_events_cuts_at_the_turn_cap() -> None:
    events = trajectory_events("run", "run/g0", AttemptSpec(0, turns=10, group_size=4))
    cut = truncate_events(events, Limits(max_turns=4))
    finished = cut[-1].data
    assert finished.outcome == Outcome.TRUNCATED_TURNS and finished.reward == 0.0  # type: ignore[union-attr]
    assert finished.turns == 4 and finished.last_seq == len(cut) - 1  # type: ignore[union-attr]
    assert cut[-1].time_ns < events[-1].time_ns
    assert truncate_events(events, Limits(max_turns=10)) == events


def test_what_if_a_lower_turn_cap() -> None:
    run = _recorded(groups=12)
    result = what_if(run, POLICY, POLICY.model_copy(update={"max_turns": 4}), Limits(max_turns=4))
    long_ones = [
        evs for evs in by_trajectory(run.events).values() if sum(e.type == "turn.generated" for e in evs) > 4
    ]
    assert long_ones and result.trajectories_changed == len(long_ones)
    assert result.rollout_time_saved_s > 0 and result.groups_changed > 0
    assert result.resolved_lost > 0 and result.after.wall_s <= result.before.wall_s
    assert result.after.slowest_turns <= 4 < result.before.slowest_turns
    same = what_if(run, POLICY, POLICY, None)
    assert (same.trajectories_changed, same.groups_changed, same.rollout_time_saved_s) == (0, 0, 0.0)


def test_tail_figures() -> None:
    assert tail_share([(0, 1)] * 9 + [(0, 10)]) == pytest.approx(0.9)
    assert tail_share([(0, 10)] * 10) == 0.0
    run = _recorded(groups=6)
    figures = tail_figures(replay(run, POLICY).folded)
    assert figures.trajectories == len(by_trajectory(run.events))
    assert 0 < figures.at_turn_cap_share < 1 and figures.median_turns_resolved is not None
    assert figures.group_length_ratio_max is not None and figures.group_length_ratio_max >= 1
    assert figures.slowest_s == max(t.duration_s for t in replay(run, POLICY).folded)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_datasets_load_with_hf_datasets(tmp_path: Path, suffix: str) -> None:
    import datasets

    run = _recorded(groups=5)
    result = replay(run, POLICY)
    sft = sft_rows(result.folded)
    assert sft and all(row["messages"][0]["role"] == "user" for row in sft)
    assert {row["trajectory_id"] for row in sft} == {
        t.trajectory_id for t in result.folded if t.outcome == "resolved"
    }
    assert sft[0]["messages"][1] == {"role": "assistant", "content": "```bash\nls step1\n```"}
    for name, rows in (
        ("sft", sft),
        ("rl", rl_rows(result.trajectories, result.groups)),
        ("trajectories", trajectory_rows(result.trajectories)),
    ):
        path = tmp_path / f"{name}{suffix}"
        write_rows(rows, path)
        loaded = datasets.load_dataset(suffix.lstrip(".").replace("jsonl", "json"), data_files=str(path))[
            "train"
        ]
        assert len(loaded) == len(rows)
        key = "group_id" if name == "rl" else "trajectory_id"
        assert loaded[0][key] == rows[0][key]
    rl = rl_rows(result.trajectories, result.groups)
    assert len(rl) == 5 and all(len(r["input_ids"]) == len(r["trajectory_ids"]) for r in rl)
    with pytest.raises(DatasetError, match="unknown format"):
        write_rows(sft, tmp_path / "x.csv")
