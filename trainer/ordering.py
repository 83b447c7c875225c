"""A deterministic order of records across the partitions of one topic (pure: no Kafka, no clock).

Kafka orders records within a partition only; the order in which a consumer sees
records of different partitions depends on fetch timing. The trainer needs one
order that every run over the same log agrees on, so that a trainer restarted from
a checkpoint forms exactly the batches an uninterrupted run would have.

The rule (`next_partition`): every partition is a queue in offset order; the next
record is the head with the smallest (time_ns, partition, offset), where `time_ns` is
the event's own time (written by its producer, so it is part of the log, unlike
the broker's receive time). A head is taken only when every other partition
either has a buffered head or has been read to its end: a partition that may still
hold an earlier record is waited for. Over a fixed log this is a pure function of
the log; on a live log it is the same order as long as records arrive on each
partition in time order, which the stream worker's groups do to within the fetch
interval (a record that arrives later with an earlier time than one already taken
is simply taken next; that one is then the only place where two runs could differ).

Resume: the records taken so far are a prefix of each partition, so restarting
every partition at the offset after its last taken record (`PartitionMerger.
taken_positions`) and merging again yields exactly the remaining order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Head:
    """The first buffered record of a partition: its event time and offset."""

    time_ns: int
    offset: int


def next_partition(heads: Mapping[int, Head | None], exhausted: Iterable[int]) -> int | None:
    """The partition whose head comes next, or None while some partition must be waited for.

    `heads`: every partition of the topic -> its head (None: nothing buffered);
    `exhausted`: partitions read to their end offset."""
    at_end = set(exhausted)
    if any(head is None and partition not in at_end for partition, head in heads.items()):
        return None
    candidates = [(head.time_ns, partition, head.offset) for partition, head in heads.items() if head]
    return min(candidates)[1] if candidates else None


@dataclass(frozen=True)
class Taken(Generic[T]):
    partition: int
    offset: int
    item: T


class PartitionMerger(Generic[T]):
    """Buffers records per partition and releases them in `next_partition` order."""

    def __init__(self, start: Mapping[int, int]) -> None:
        """`start`: every partition -> the offset reading starts at (0, or a checkpoint's)."""
        self._queues: dict[int, deque[tuple[Head, T]]] = {p: deque() for p in start}
        self._taken: dict[int, int] = dict(start)

    def add(self, partition: int, offset: int, time_ns: int, item: T) -> None:
        if partition not in self._queues:
            raise KeyError(f"partition {partition} was not assigned to this merger")
        queue = self._queues[partition]
        if queue and queue[-1][0].offset >= offset:
            raise ValueError(f"partition {partition}: offset {offset} after {queue[-1][0].offset}")
        queue.append((Head(time_ns, offset), item))

    def take(self, exhausted: Iterable[int]) -> Taken[T] | None:
        """The next record in order, or None while it cannot be known yet."""
        heads = {p: (q[0][0] if q else None) for p, q in self._queues.items()}
        partition = next_partition(heads, exhausted)
        if partition is None:
            return None
        head, item = self._queues[partition].popleft()
        self._taken[partition] = head.offset + 1
        return Taken(partition, head.offset, item)

    def empty_partitions(self) -> list[int]:
        return [p for p, q in self._queues.items() if not q]

    def buffered(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def taken_positions(self) -> dict[int, int]:
        """Per partition: the offset after the last record taken (or the start offset)."""
        return dict(self._taken)
