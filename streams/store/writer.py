"""Write a batch of events, their projections and the consumer offsets in one transaction.

`write_batch` is the only way the sink changes the database. Within one
transaction it inserts the events (`ON CONFLICT DO NOTHING`: an event id or a
Kafka position already stored is skipped), upserts the projections of the
events that were new, and upserts the offsets. Projections are folded from the
deduplicated stream only, so the first stored copy of an event id is the one
every projection reflects; re-applying a batch changes nothing.

Works on SQLite and PostgreSQL through their dialects' `insert().on_conflict_*`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Table, select
from sqlalchemy.dialects import postgresql, sqlite

from streams.store.models import Base, ConsumerOffset, EventRow
from streams.store.rows import ProjectionRow, StoredEvent, event_row, projection_rows

_TABLES: dict[str, Table] = dict(Base.metadata.tables)


def write_batch(
    conn: Connection,
    events: Sequence[StoredEvent],
    offsets: Mapping[tuple[str, int], int],
    consumer: str,
) -> int:
    """Store `events` and set `consumer`'s next offsets; call inside `engine.begin()`. Returns new events."""
    new_ids = insert_events(conn, [event_row(stored) for stored in events])
    fresh = [stored.event for stored in events if str(stored.event.id) in new_ids]
    upsert_projections(conn, (row for event in fresh for row in projection_rows(event)))
    store_offsets(conn, consumer, offsets)
    return len(new_ids)


def insert_events(conn: Connection, rows: list[dict[str, Any]]) -> set[str]:
    """Insert `rows` into `events`, skipping ids (and positions) already there; the ids inserted."""
    if not rows:
        return set()
    rows = _unique_by(rows, ("id",), keep="first")
    stmt = _insert(conn, EventRow.__table__).on_conflict_do_nothing().returning(EventRow.id)
    return set(conn.execute(stmt, rows).scalars().all())


def upsert_projections(conn: Connection, rows: Iterable[ProjectionRow]) -> None:
    """Upsert projection rows, one statement per (table, column set); later rows win on a key."""
    buckets: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[dict[str, Any]]] = {}
    for row in rows:
        buckets.setdefault((row.table, row.key, tuple(row.values)), []).append(row.values)
    for (table_name, key, columns), values in buckets.items():
        # PostgreSQL refuses one statement touching a row twice; keep the last value per key.
        _upsert(conn, _TABLES[table_name], key, columns, _unique_by(values, key, keep="last"))


def store_offsets(conn: Connection, consumer: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """Set `consumer`'s next offset for each (topic, partition)."""
    if not offsets:
        return
    now = time.time_ns()
    rows = [
        {"consumer": consumer, "topic": topic, "partition": part, "next_offset": offset, "updated_ns": now}
        for (topic, part), offset in offsets.items()
    ]
    table = ConsumerOffset.__table__
    _upsert(conn, table, ("consumer", "topic", "partition"), tuple(rows[0]), rows)


def load_offsets(conn: Connection, consumer: str) -> dict[tuple[str, int], int]:
    """`consumer`'s stored next offsets by (topic, partition)."""
    query = select(ConsumerOffset.topic, ConsumerOffset.partition, ConsumerOffset.next_offset).where(
        ConsumerOffset.consumer == consumer
    )
    return {(topic, partition): offset for topic, partition, offset in conn.execute(query)}


def _upsert(
    conn: Connection, table: Table, key: tuple[str, ...], columns: tuple[str, ...], rows: list[dict[str, Any]]
) -> None:
    stmt = _insert(conn, table)
    updates = {name: stmt.excluded[name] for name in columns if name not in key}
    conn.execute(stmt.on_conflict_do_update(index_elements=list(key), set_=updates), rows)


def _insert(conn: Connection, table: Table) -> Any:
    dialect = conn.dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise ValueError(f"the event store supports sqlite and postgresql, not {dialect}")


def _unique_by(rows: list[dict[str, Any]], key: tuple[str, ...], keep: str) -> list[dict[str, Any]]:
    unique: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        ident = tuple(row[name] for name in key)
        if keep == "last" or ident not in unique:
            unique[ident] = row
    return list(unique.values())
