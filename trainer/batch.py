"""Training samples from kept groups, and micro-batches of them (pure: no Kafka, clock or torch state).

What the trainer's stages pass each other (the loop, SFT, the backends and `bench trainer` use these):
- `TrainSample`: one member trajectory of a kept group with its advantage.
- `StepBatch`: one step's kept groups (`KeptGroup`: the `group.formed` event and its samples),
  in the order the loop took them; the loop collects it and trains on `StepBatch.samples`.
- `samples_of(group_event_data, trajectories_by_id) -> list[TrainSample]` (and an optional
  `group_id`, the envelope's; `GroupMismatchError` / `MissingTrajectoryError` when they do not fit).
- `micro_batches(samples, max_tokens) -> list[list[TrainSample]]`: deterministic packing,
  order kept, each micro-batch at most `max_tokens` tokens (a longer sample alone). Tokens
  are counted padded (rows × longest), what a forward pass really holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from streams.events import Event
from streams.packed import Logprobs, LossMask, TokenIds
from streams.payloads import GroupFormed, TrajectoryAssembled


@dataclass(frozen=True)
class TrainSample:
    group_id: str
    trajectory_id: str
    token_ids: TokenIds
    loss_mask: LossMask
    rollout_logprobs: Logprobs
    token_versions: TokenIds
    advantage: float
    reward: float
    loss_masked: bool = False  # overlong member: kept for the group's statistics, no loss

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class KeptGroup:
    """A kept group of a step's batch: its `group.formed` event and its members' samples."""

    event: Event
    samples: tuple[TrainSample, ...]


@dataclass(frozen=True)
class StepBatch:
    """One step's kept groups, in the order they were taken."""

    groups: tuple[KeptGroup, ...]

    @property
    def samples(self) -> list[TrainSample]:
        return [sample for group in self.groups for sample in group.samples]

    @property
    def group_ids(self) -> list[str]:
        return [group.event.group_id or "" for group in self.groups]


class GroupMismatchError(ValueError):
    """A group event and its member trajectories do not fit together; the message says how."""


class MissingTrajectoryError(LookupError):
    """A member of a kept group has no trajectory yet: consume its `trajectories` record first."""


def samples_of(
    group: GroupFormed, trajectories_by_id: Mapping[str, TrajectoryAssembled], group_id: str = ""
) -> list[TrainSample]:
    """The members of a kept group as samples, in member order, each with its advantage and reward.

    `group_id` is the group event's envelope `group_id` (payloads do not carry it). Raises
    `GroupMismatchError` for a dropped group or lengths that disagree, `MissingTrajectoryError`
    when a member's trajectory is not in `trajectories_by_id`."""
    label = f"group {group_id!r}" if group_id else "the group"
    if group.dropped is not None:
        raise GroupMismatchError(f"{label} was dropped ({group.dropped}): only kept groups train")
    members = len(group.members)
    masked = list(group.loss_masked) or [False] * members
    if not len(group.advantages) == len(group.rewards) == len(masked) == members:
        raise GroupMismatchError(
            f"{label} has {members} members but {len(group.advantages)} advantages, "
            f"{len(group.rewards)} rewards and {len(group.loss_masked)} loss_masked flags: "
            "they must be one per member (loss_masked may be empty)"
        )
    missing = [m for m in group.members if m not in trajectories_by_id]
    if missing:
        raise MissingTrajectoryError(f"{label} names trajectories not yet consumed: {', '.join(missing)}")
    samples = []
    for index, member in enumerate(group.members):
        trajectory = trajectories_by_id[member]
        _check_lengths(member, trajectory)
        samples.append(
            TrainSample(
                group_id=group_id,
                trajectory_id=member,
                token_ids=trajectory.token_ids,
                loss_mask=trajectory.loss_mask,
                rollout_logprobs=trajectory.rollout_logprobs,
                token_versions=trajectory.token_versions,
                advantage=float(group.advantages[index]),
                reward=float(group.rewards[index]),
                loss_masked=bool(masked[index]),
            )
        )
    return samples


def _check_lengths(member: str, trajectory: TrajectoryAssembled) -> None:
    lengths = {
        "token_ids": len(trajectory.token_ids),
        "loss_mask": len(trajectory.loss_mask),
        "rollout_logprobs": len(trajectory.rollout_logprobs),
        "token_versions": len(trajectory.token_versions),
    }
    if len(set(lengths.values())) != 1:
        shown = ", ".join(f"{name} {n}" for name, n in lengths.items())
        raise GroupMismatchError(f"trajectory {member!r} has arrays of different lengths ({shown})")
    if lengths["token_ids"] < 2:
        raise GroupMismatchError(f"trajectory {member!r} has {lengths['token_ids']} tokens: needs at least 2")


class HasTokens(Protocol):
    @property
    def tokens(self) -> int: ...


Item = TypeVar("Item", bound=HasTokens)


def padded_tokens(samples: Sequence[HasTokens]) -> int:
    """What a micro-batch of `samples` costs once padded: rows × the longest sample."""
    return len(samples) * max((s.tokens for s in samples), default=0)


def micro_batches(samples: Sequence[Item], max_tokens: int) -> list[list[Item]]:
    """Consecutive runs of `samples` (train samples or SFT sequences), order kept, each at most
    `max_tokens` padded tokens (`padded_tokens`, which bounds the real tokens too); a longer
    sample goes alone."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}: set trainer.micro_batch_tokens")
    batches: list[list[Item]] = []
    current: list[Item] = []
    for sample in samples:
        if current and padded_tokens([*current, sample]) > max_tokens:
            batches.append(current)
            current = []
        current.append(sample)
    if current:
        batches.append(current)
    return batches
