"""Events written to a store directly (no Kafka), at made-up but consistent Kafka positions."""

from __future__ import annotations

from streams.eventgen import short_topic
from streams.events import Event
from streams.store import StoredEvent, open_store, write_batch
from streams.store.wire import to_wire


def positioned(events: list[Event], partitions: int = 3) -> list[StoredEvent]:
    """Events at made-up but consistent Kafka positions (offsets per topic and partition)."""
    next_offset: dict[tuple[str, int], int] = {}
    out = []
    for index, event in enumerate(events):
        where = (f"t-{short_topic(event)}", index % partitions)
        offset = next_offset.get(where, 0)
        next_offset[where] = offset + 1
        out.append(StoredEvent(to_wire(event), where[0], where[1], offset))
    return out


def ends(stored: list[StoredEvent]) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for item in stored:
        out[(item.topic, item.partition)] = max(out.get((item.topic, item.partition), 0), item.offset + 1)
    return out


def write_in_batches(url: str, stored: list[StoredEvent], size: int = 500) -> None:
    engine = open_store(url)
    for start in range(0, len(stored), size):
        chunk = stored[start : start + size]
        with engine.begin() as conn:
            write_batch(conn, chunk, ends(chunk), "sink")
    engine.dispose()
