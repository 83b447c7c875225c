"""GRPO groups from folded trajectories: the failure, length and staleness policies (pure).

A group is the `group_size` attempts of one task. Each attempt may have several
trajectories: an attempt that ended in an infrastructure error is re-run with
the same attempt index and a higher `retry`; the latest non-infra retry is the
one that counts, and an attempt whose every retry failed on infrastructure is
never scored (it counts in `infra_errors`, never in rewards).

`attempts_waiting(trajectories, policy)` says which attempts a group still waits
for; `form_group(trajectories, policy, latest_version)` applies, in order:
overlong handling (truncated members: `mask` keeps the reward but masks the loss,
`drop` removes the member, `zero` keeps it with reward 0), min valid attempts
(`too_few_valid`), max staleness against the latest weight version (`stale`),
and the zero-variance drop (`zero_variance`); a kept group gets group-normalised
advantages (reward minus the group mean, divided by the std when `normalise_std`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from streams.assemble import Trajectory
from streams.payloads import DropReason
from streams.settings import PolicySettings


@dataclass(frozen=True)
class GroupResult:
    """A formed group: valid members in attempt order with their rewards, and either advantages
    (kept: `dropped` is None) or the reason it is not trained on (`dropped`, with `detail` saying
    why; advantages are then all 0 and nothing is loss-masked)."""

    run_id: str
    group_id: str
    task_id: str
    members: tuple[Trajectory, ...]
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    loss_masked: tuple[bool, ...]
    infra_errors: int
    oldest_version: int
    latest_version: int
    finished_ns: int
    policy: PolicySettings
    dropped: DropReason | None = None
    detail: str = ""

    @property
    def kept(self) -> bool:
        return self.dropped is None


def counted_attempts(trajectories: Iterable[Trajectory]) -> dict[int, Trajectory]:
    """Per attempt index, the trajectory that counts: the latest non-infra retry, else the latest retry."""
    best: dict[int, Trajectory] = {}
    for trajectory in trajectories:
        seen = best.get(trajectory.attempt)
        if seen is None or _rank(trajectory) > _rank(seen):
            best[trajectory.attempt] = trajectory
    return dict(sorted(best.items()))


def _rank(trajectory: Trajectory) -> tuple[bool, int]:
    return (trajectory.is_scored, trajectory.retry)


def group_size_of(trajectories: Sequence[Trajectory], policy: PolicySettings) -> int:
    """The size the attempts were started with (recorded on each), else the policy's."""
    return max((t.group_size for t in trajectories), default=policy.group_size)


def attempts_waiting(
    trajectories: Sequence[Trajectory], policy: PolicySettings, settled: Iterable[int] = ()
) -> list[int]:
    """Attempt indexes not settled yet: not finished, or an infra error with retries left.

    `settled` are attempts the caller gave up on (malformed, or lost after the deadline).
    """
    counted = counted_attempts(trajectories)
    gave_up = set(settled)
    waiting = []
    for attempt in range(group_size_of(trajectories, policy)):
        trajectory = counted.get(attempt)
        if attempt in gave_up:
            continue
        if trajectory is None or (not trajectory.is_scored and trajectory.retry < policy.infra_error_retries):
            waiting.append(attempt)
    return waiting


def advantages(rewards: Sequence[float], policy: PolicySettings) -> list[float]:
    """Group-normalised advantages: r - mean, divided by (std + eps) when `normalise_std`."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not policy.normalise_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + policy.advantage_eps) for c in centred]


def form_group(
    trajectories: Sequence[Trajectory], policy: PolicySettings, latest_version: int
) -> GroupResult:
    """The group of these trajectories (all retries of all attempts) under `policy`."""
    if not trajectories:
        raise ValueError("form_group needs at least one trajectory")
    first = trajectories[0]
    counted = list(counted_attempts(trajectories).values())
    infra_errors = sum(1 for t in trajectories if not t.is_scored)
    members, rewards, masked = _apply_overlong([t for t in counted if t.is_scored], policy)
    # a member that generated no token (a cap or the time budget before its first call) has no version
    oldest = min((t.oldest_version for t in members if t.oldest_version is not None), default=latest_version)
    latest = max([latest_version, *(t.newest_version for t in members if t.newest_version is not None)])
    dropped = _drop_reason(len(members), len(counted), infra_errors, rewards, oldest, latest, policy)
    reason, detail = dropped if dropped is not None else (None, "")
    return GroupResult(
        run_id=first.run_id,
        group_id=first.group_id,
        task_id=first.task_id,
        members=tuple(members),
        rewards=tuple(rewards),
        advantages=(0.0,) * len(members) if dropped else tuple(advantages(rewards, policy)),
        loss_masked=() if dropped else tuple(masked),
        infra_errors=infra_errors,
        oldest_version=oldest,
        latest_version=latest,
        finished_ns=max(t.finished_ns for t in trajectories),
        policy=policy,
        dropped=reason,
        detail=detail,
    )


def is_stale(oldest_version: int, latest_version: int, max_staleness: int) -> bool:
    """The staleness rule, one copy for the stream worker (at group time) and the trainer (at
    batch time): more than `max_staleness` versions between the oldest token and the latest
    version; a negative `max_staleness` turns the check off."""
    return max_staleness >= 0 and latest_version - oldest_version > max_staleness


def _drop_reason(
    valid: int,
    attempts: int,
    infra_errors: int,
    rewards: list[float],
    oldest: int,
    latest: int,
    policy: PolicySettings,
) -> tuple[DropReason, str] | None:
    """(reason, detail) when the group is dropped, checked in order: too few valid, stale, zero variance."""
    if valid < policy.min_valid_attempts:
        return "too_few_valid", (
            f"{valid} valid of {attempts} attempts ({infra_errors} infra errors), "
            f"min_valid_attempts={policy.min_valid_attempts}"
        )
    if is_stale(oldest, latest, policy.max_staleness):
        return (
            "stale",
            f"oldest token version {oldest}, latest {latest}, max_staleness={policy.max_staleness}",
        )
    if policy.drop_zero_variance and len(set(rewards)) == 1:
        return "zero_variance", f"every valid attempt has reward {rewards[0]}"
    return None


def _apply_overlong(
    scored: list[Trajectory], policy: PolicySettings
) -> tuple[list[Trajectory], list[float], list[bool]]:
    """Members, rewards and loss-masked flags after the overlong policy."""
    members: list[Trajectory] = []
    rewards: list[float] = []
    masked: list[bool] = []
    for trajectory in scored:
        reward = trajectory.reward if trajectory.reward is not None else 0.0
        overlong = trajectory.outcome.is_truncated
        if overlong and policy.overlong == "drop":
            continue
        if overlong and policy.overlong == "zero":
            reward = 0.0
        members.append(trajectory)
        rewards.append(reward)
        masked.append(overlong and policy.overlong == "mask")
    return members, rewards, masked
