"""Forming GRPO groups: retries, infra errors, min valid, staleness, zero variance, overlong."""

from __future__ import annotations

import pytest

from streams.assemble import Trajectory, fold_trajectory
from streams.eventgen import AttemptSpec, trajectory_events
from streams.groups import advantages, attempts_waiting, form_group
from streams.outcomes import Outcome
from streams.settings import PolicySettings

POLICY = PolicySettings(group_size=4)


def _t(
    attempt: int,
    outcome: Outcome = Outcome.RESOLVED,
    reward: float | None = 1.0,
    *,
    retry: int = 0,
    version: int = 0,
    turns: int = 2,
) -> Trajectory:
    spec = AttemptSpec(attempt, retry, turns, outcome, reward, version, group_size=4)
    folded = fold_trajectory(trajectory_events("run", "run/g0", spec))
    assert isinstance(folded, Trajectory)
    return folded


def _mixed() -> list[Trajectory]:
    return [_t(0), _t(1, Outcome.UNRESOLVED, 0.0), _t(2), _t(3, Outcome.UNRESOLVED, 0.0)]


def test_kept_group_has_normalised_advantages() -> None:
    group = form_group(_mixed(), POLICY, latest_version=0)
    assert group.kept
    assert [t.attempt for t in group.members] == [0, 1, 2, 3]
    assert group.rewards == (1.0, 0.0, 1.0, 0.0)
    assert sum(group.advantages) == pytest.approx(0.0, abs=1e-9)
    assert group.advantages[0] == pytest.approx(1.0, rel=1e-4)
    no_std = PolicySettings(group_size=4, normalise_std=False)
    assert advantages([1.0, 0.0, 1.0, 0.0], no_std) == [0.5, -0.5, 0.5, -0.5]


def test_infra_errors_are_rerun_and_never_in_rewards() -> None:
    infra = _t(1, Outcome.INFRA_SANDBOX_START, None)
    base = [_t(0), infra, _t(2), _t(3, Outcome.UNRESOLVED, 0.0)]
    assert attempts_waiting(base, POLICY) == [1]  # retries left: wait for the re-run
    rerun = _t(1, Outcome.UNRESOLVED, 0.0, retry=1)
    assert attempts_waiting([*base, rerun], POLICY) == []
    group = form_group([*base, rerun], POLICY, 0)
    assert group.kept
    assert [t.trajectory_id for t in group.members] == [
        "run/g0/a0r0",
        "run/g0/a1r1",
        "run/g0/a2r0",
        "run/g0/a3r0",
    ]
    assert group.infra_errors == 1 and len(group.rewards) == 4


def test_exhausted_infra_attempt_is_settled_but_not_scored() -> None:
    tries = [_t(1, Outcome.INFRA_ENGINE, None, retry=r) for r in range(3)]
    members = [_t(0), *tries, _t(2), _t(3, Outcome.UNRESOLVED, 0.0)]
    assert attempts_waiting(members, POLICY) == []
    group = form_group(members, POLICY, 0)
    assert group.kept
    assert group.infra_errors == 3 and group.rewards == (1.0, 1.0, 0.0)
    assert all(t.is_scored for t in group.members)


def test_too_few_valid() -> None:
    members = [_t(0)] + [_t(a, Outcome.INFRA_NETWORK, None, retry=2) for a in (1, 2, 3)]
    dropped = form_group(members, POLICY, 0)
    assert dropped.dropped == "too_few_valid"
    assert dropped.rewards == (1.0,) and "min_valid_attempts=2" in dropped.detail
    assert dropped.advantages == (0.0,) and dropped.loss_masked == ()  # a drop trains on nothing


def test_zero_variance_dropped_unless_disabled() -> None:
    same = [_t(a, Outcome.UNRESOLVED, 0.0) for a in range(4)]
    dropped = form_group(same, POLICY, 0)
    assert dropped.dropped == "zero_variance"
    kept = form_group(same, PolicySettings(group_size=4, drop_zero_variance=False), 0)
    assert kept.kept and kept.advantages == (0.0, 0.0, 0.0, 0.0)


def test_stale_against_latest_version() -> None:
    members = [
        _t(0, version=3),
        _t(1, Outcome.UNRESOLVED, 0.0, version=5),
        _t(2, version=5),
        _t(3, version=5),
    ]
    assert form_group(members, POLICY, latest_version=7).kept  # 7 - 3 = 4 <= 4
    dropped = form_group(members, POLICY, latest_version=8)
    assert dropped.dropped == "stale" and dropped.oldest_version == 3
    unlimited = PolicySettings(group_size=4, max_staleness=-1)
    assert form_group(members, unlimited, latest_version=100).kept


@pytest.mark.parametrize(
    ("overlong", "rewards", "masked"),
    [
        ("mask", (1.0, 0.5, 0.0, 0.0), (False, True, False, False)),
        ("zero", (1.0, 0.0, 0.0, 0.0), None),
        ("drop", (1.0, 0.0, 0.0), None),
    ],
)
def test_overlong_policies(overlong: str, rewards: tuple, masked: tuple | None) -> None:
    members = [
        _t(0),
        _t(1, Outcome.TRUNCATED_TURNS, 0.5, turns=9),
        _t(2, Outcome.UNRESOLVED, 0.0),
        _t(3, Outcome.UNRESOLVED, 0.0),
    ]
    group = form_group(members, PolicySettings(group_size=4, overlong=overlong), 0)  # type: ignore[arg-type]
    assert group.kept
    assert group.rewards == rewards
    if masked is not None:
        assert group.loss_masked == masked
    else:
        assert not any(group.loss_masked)
