"""Which request offsets a rollout worker may commit (pure, no Kafka).

A request's offset is committed only once its `trajectory.finished` is written.
Episodes finish out of order, so per partition the committable position is the
lowest offset still in flight (everything below it is done), or one past the
highest finished offset when nothing is in flight. A worker killed before
committing leaves every unfinished request (and possibly some finished ones) to
be re-run; the re-run writes the same event ids.
"""

from __future__ import annotations

from collections import defaultdict

Partition = tuple[str, int]  # (short topic name, partition)


class OffsetTracker:
    def __init__(self) -> None:
        self._in_flight: dict[Partition, set[int]] = defaultdict(set)
        self._next: dict[Partition, int] = {}
        self._committed: dict[Partition, int] = {}

    def started(self, partition: Partition, offset: int) -> None:
        self._in_flight[partition].add(offset)
        self._next.setdefault(partition, offset)

    def finished(self, partition: Partition, offset: int) -> None:
        self._in_flight[partition].discard(offset)
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)

    def seen(self, partition: Partition, offset: int) -> bool:
        """Running or finished here already (a rebalance re-delivers from the committed offset)."""
        return offset in self._in_flight.get(partition, ()) or offset < self._next.get(partition, -1)

    def partitions(self) -> set[Partition]:
        return set(self._next)

    def committable(self) -> dict[Partition, int]:
        """Next offsets that can be committed and were not committed yet."""
        positions: dict[Partition, int] = {}
        for partition, next_offset in self._next.items():
            pending = self._in_flight.get(partition)
            position = min(pending) if pending else next_offset
            if position > self._committed.get(partition, -1):
                positions[partition] = position
        return positions

    def mark_committed(self, positions: dict[Partition, int]) -> None:
        for partition, position in positions.items():
            self._committed[partition] = max(self._committed.get(partition, -1), position)

    def forget(self, partitions: set[Partition]) -> None:
        """Partitions revoked from this worker: their offsets are no longer ours to commit."""
        for partition in partitions:
            self._in_flight.pop(partition, None)
            self._next.pop(partition, None)
            self._committed.pop(partition, None)

    @property
    def in_flight(self) -> int:
        return sum(len(offsets) for offsets in self._in_flight.values())
