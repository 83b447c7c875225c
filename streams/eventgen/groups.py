"""Synthetic `trajectories` and `groups` records, as the stream worker writes them (tests, benchmarks).

`synthetic_groups(spec)` builds a recorded log for the trainer: per group, its
member `trajectory.assembled` records, then its `group.formed` record, with real
payload models, deterministic ids and keys (the group id), event times one
`spacing_ns` apart. Some groups can be dropped (`zero_variance`) or carry an old
`oldest_version` so the trainer judges them stale. Pure: randomness from the seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from streams.events import Event, make_event
from streams.groups import advantages
from streams.outcomes import Outcome
from streams.payloads import GroupFormed, TimeBreakdown, TrajectoryAssembled
from streams.settings import PolicySettings

NS = 1_000_000_000


@dataclass(frozen=True)
class GroupLogSpec:
    run_id: str
    groups: int
    group_size: int = 4
    prompt_tokens: int = 8
    output_tokens: int = 24
    vocab_size: int = 256
    seed: int = 0
    start_ns: int = 1_700_000_000 * NS
    spacing_ns: int = NS
    zero_variance_every: int = 0  # every Nth group is a recorded zero_variance drop; 0 = none
    stale_groups: tuple[int, ...] = ()  # indexes of groups whose tokens come from version 0
    versions_per_group: float = 0.5  # token version of group i: int(i * this), as a trainer keeps up


def synthetic_groups(spec: GroupLogSpec) -> list[tuple[str, Event]]:
    """(short topic, event) in write order: each group's trajectories, then the group."""
    rng = random.Random(spec.seed)
    policy = PolicySettings()
    out: list[tuple[str, Event]] = []
    for index in range(spec.groups):
        group_id = f"{spec.run_id}-g{index:04d}"
        version = 0 if index in spec.stale_groups else int(index * spec.versions_per_group)
        rewards, dropped = _rewards(spec, rng, index)
        members = []
        for attempt, reward in enumerate(rewards):
            trajectory_id = f"{group_id}-a{attempt}"
            members.append(trajectory_id)
            data = _trajectory(spec, rng, attempt, reward, version)
            out.append(("trajectories", _event(spec, data, index, group_id, version, trajectory_id)))
        group = GroupFormed(
            members=members,
            rewards=rewards,
            advantages=[0.0] * len(rewards) if dropped else advantages(rewards, policy),
            dropped="zero_variance" if dropped else None,
            oldest_version=version,
            policy=policy.model_dump(),
        )
        out.append(("groups", _event(spec, group, index, group_id, version)))
    return out


def _rewards(spec: GroupLogSpec, rng: random.Random, index: int) -> tuple[list[float], bool]:
    """Group `index`'s rewards and whether it is a recorded zero-variance drop."""
    every = spec.zero_variance_every
    dropped = bool(every) and index % every == every - 1
    if dropped:
        return [1.0] * spec.group_size, True
    rewards = [float(rng.random() < 0.5) for _ in range(spec.group_size)]
    if len(set(rewards)) == 1:
        rewards[0] = 1.0 - rewards[0]  # kept groups need variance
    return rewards, False


def _event(
    spec: GroupLogSpec,
    data: TrajectoryAssembled | GroupFormed,
    index: int,
    group_id: str,
    version: int,
    trajectory_id: str | None = None,
) -> Event:
    """A trajectory's (`trajectory_id` given) or the group's event, at the group's time."""
    return make_event(
        data,
        run_id=spec.run_id,
        seq=0,
        time_ns=spec.start_ns + index * spec.spacing_ns,
        source="synthetic",
        group_id=group_id,
        trajectory_id=trajectory_id,
        task_id=f"task-{index}",
        policy_version=version,
        id_key=f"trajectory:{trajectory_id}" if trajectory_id else f"group:{group_id}",
    )


def _trajectory(
    spec: GroupLogSpec, rng: random.Random, attempt: int, reward: float, version: int
) -> TrajectoryAssembled:
    length = spec.prompt_tokens + spec.output_tokens
    token_ids = [rng.randrange(spec.vocab_size) for _ in range(length)]
    mask = [0] * spec.prompt_tokens + [1] * spec.output_tokens
    logprobs = [0.0] * spec.prompt_tokens + [-rng.uniform(0.5, 6.0) for _ in range(spec.output_tokens)]
    return TrajectoryAssembled(
        attempt=attempt,
        outcome=Outcome.RESOLVED if reward else Outcome.UNRESOLVED,
        reward=reward,
        token_ids=token_ids,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        token_versions=[-1] * spec.prompt_tokens + [version] * spec.output_tokens,
        prompt_tokens=spec.prompt_tokens,
        turns=1,
        generated_tokens=spec.output_tokens,
        context_tokens=length,
        times=TimeBreakdown(),
        policy={},
    )
