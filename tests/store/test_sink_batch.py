"""What a decoded sink batch holds while it waits for its commit: rows, not decoded events."""

from __future__ import annotations

import gc
import types

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord
from pydantic import BaseModel

from streams.eventgen import generate_events
from streams.events import encode_event
from streams.sink import split_batch
from streams.store import StoredEvent


def held_by(root: object) -> list[object]:
    """Every object `root` holds: the referents the garbage collector sees, followed through
    containers and instances but not into classes, modules or functions."""
    seen: dict[int, object] = {id(root): root}
    todo = [root]
    while todo:
        for child in gc.get_referents(todo.pop()):
            if id(child) in seen or isinstance(child, (type, types.ModuleType, types.FunctionType)):
                continue
            seen[id(child)] = child
            todo.append(child)
    return list(seen.values())


def test_a_batch_keeps_its_rows_and_drops_the_decoded_events() -> None:
    """Thousands of decoded events (pydantic models, ~10 tracked objects each) kept until the commit
    made every young collection scan them; the batch holds plain rows and projection rows only."""
    events = generate_events(300, seed=4)
    records = [
        ConsumerRecord("t", 0, offset, 0, 0, None, encode_event(event), None, 0, 0, [])
        for offset, event in enumerate(events)
    ]
    batch = split_batch({TopicPartition("t", 0): records})
    assert batch.valid == len(events) and batch.offsets == {("t", 0): len(events)}
    assert [row["id"] for row in batch.rows.event_rows] == [str(event.id) for event in events]
    held = held_by(batch)
    assert not [item for item in held if isinstance(item, (BaseModel, StoredEvent, ConsumerRecord))]
