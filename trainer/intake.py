"""What the trainer does with each group it takes, and the batch figures (pure: no Kafka, no clock).

`judge_group` decides, for a `groups` record taken in order: train it, or count it
as dropped by the stream policies (`zero_variance`, `too_few_valid`, ...), or as
stale now: the trainer re-checks staleness at batch time against its own version
with the same rule the stream worker applies (`streams.groups.is_stale`).
`TrajectoryBuffer` joins groups with their member trajectories by id and knows the
lowest `trajectories` offset still needed per partition (what a checkpoint keeps).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from streams.groups import is_stale
from streams.payloads import GroupFormed, TrajectoryAssembled
from trainer.batch import TrainSample

TRAIN = "train"
STALE = "stale"
ZERO_VARIANCE = "zero_variance"


def judge_group(group: GroupFormed, trainer_version: int, max_staleness: int) -> str:
    """TRAIN, or why not: the stream worker's drop reason, or STALE at the trainer's version."""
    if group.dropped:
        return group.dropped
    if is_stale(group.oldest_version, trainer_version, max_staleness):
        return STALE
    return TRAIN


@dataclass(frozen=True)
class Staleness:
    mean: float
    max: int


def batch_staleness(samples: Sequence[TrainSample], trainer_version: int) -> Staleness:
    """Per sample: trainer version minus its oldest generated token's version (prompt tokens, -1, skipped)."""
    gaps = []
    for sample in samples:
        versions = [v for v in sample.token_versions if v >= 0]
        if versions:
            gaps.append(trainer_version - min(versions))
    if not gaps:
        return Staleness(0.0, 0)
    return Staleness(sum(gaps) / len(gaps), max(gaps))


@dataclass
class _Held:
    partition: int
    offset: int
    data: TrajectoryAssembled


class TrajectoryBuffer:
    """Trajectories read but not yet used, by id (first copy wins), oldest evicted past `capacity`."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self.evicted = 0

    def add(self, trajectory_id: str, partition: int, offset: int, data: TrajectoryAssembled) -> None:
        if trajectory_id in self._held:
            return  # a re-emitted copy
        self._held[trajectory_id] = _Held(partition, offset, data)
        while len(self._held) > self.capacity:
            self._held.popitem(last=False)
            self.evicted += 1

    def missing(self, ids: Iterable[str]) -> list[str]:
        return [i for i in ids if i not in self._held]

    def take(self, ids: Iterable[str]) -> dict[str, TrajectoryAssembled]:
        """Remove and return the held trajectories among `ids` (absent ones are skipped)."""
        return {i: self._held.pop(i).data for i in ids if i in self._held}

    def lowest_needed(self, positions: dict[int, int]) -> dict[int, int]:
        """Per partition: the lowest offset of a held trajectory, else `positions` (read so far)."""
        lowest = dict(positions)
        for held in self._held.values():
            if held.partition in lowest and held.offset < lowest[held.partition]:
                lowest[held.partition] = held.offset
        return lowest

    def __len__(self) -> int:
        return len(self._held)
