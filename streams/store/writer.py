"""Write a batch of events, their projections and the consumer offsets in one transaction.

`write_batch` is the only way the sink changes the database. Within one
transaction it inserts the events (copies already stored under the same
(id, source) are skipped; `ON CONFLICT DO NOTHING` guards that key and the Kafka
position), upserts the projections of the events that were new, and upserts the
offsets; re-applying a batch changes nothing.

Copies from several runs: a rollout worker killed mid-episode leaves a partial
copy that its re-run writes again under the same ids, from another `source`,
possibly with other samples. Both are stored. A trajectory that more than one
run has written (two sources of its `trajectory.started`) has its projections
(`trajectories`, `turns`, `tool_calls`, `sandbox_lifecycle`) rebuilt in the same
transaction from the copies `streams.assemble.dedupe_by_seq` keeps: the rule the
stream processor and replay fold with, so the finishing run wins at every seq
whichever copy arrived first, and no projection mixes two runs.

Statements are SQLAlchemy Core (`insert().on_conflict_*` of the sqlite and
postgresql dialects), compiled once and run with the driver's executemany: the
rows already hold plain values and JSON text, so per-row parameter processing
is skipped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain
from operator import itemgetter
from typing import Any

from sqlalchemy import JSON, Connection, Dialect, Table, Text, bindparam, cast, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import JSONB

from streams.assemble import MalformedTrajectory, dedupe_by_seq
from streams.events import ROLLOUT_EVENT_TYPES, Event
from streams.store.models import Base, ConsumerOffset, EventRow
from streams.store.rows import ProjectionRow, StoredEvent, event_row, projection_rows
from streams.store.wire import WireEvent, wire_from_row

_TABLES: dict[str, Table] = dict(Base.metadata.tables)
# Projections keyed by trajectory: rebuilt from the winning copies of a trajectory several runs wrote.
TRAJECTORY_PROJECTIONS = ("trajectories", "turns", "tool_calls", "sandbox_lifecycle")
ID_LOOKUP_CHUNK = 1000  # ids per `IN (...)`, well under every backend's bound-parameter limit
ROWS_PER_STATEMENT = 500  # rows per multi-row INSERT on SQLite
SQLITE_VARIABLES = 32_766  # SQLite's default bound-parameter limit since 3.32


@dataclass(frozen=True)
class PreparedBatch:
    """A batch's `events` rows and, per (id, source), its projection rows (built outside the transaction)."""

    event_rows: list[dict[str, Any]]
    projections: dict[tuple[str, str], list[ProjectionRow]]


def prepare_batch(events: Sequence[StoredEvent]) -> PreparedBatch:
    """The rows of `events` (pure; the sink builds them while the previous batch commits)."""
    rows = [event_row(stored) for stored in events]
    projections = {
        copy_key(row): projection_rows(stored.event) for stored, row in zip(events, rows, strict=True)
    }
    return PreparedBatch(rows, projections)


def copy_key(row: Mapping[str, Any]) -> tuple[str, str]:
    """The `events` key of a row: (id, source)."""
    return row["id"], row["source"]


def write_batch(
    conn: Connection,
    batch: Sequence[StoredEvent] | PreparedBatch,
    offsets: Mapping[tuple[str, int], int],
    consumer: str,
) -> int:
    """Store the events and set `consumer`'s next offsets (inside `engine.begin()`); the new events."""
    prepared = batch if isinstance(batch, PreparedBatch) else prepare_batch(batch)
    fresh = insert_events(conn, prepared.event_rows)
    rerun = rerun_trajectories(conn, fresh)
    winners = winning_copies(conn, rerun)
    upsert_projections(
        conn,
        (
            projection
            for row in fresh
            if row["trajectory_id"] not in winners
            for projection in prepared.projections[copy_key(row)]
        ),
    )
    reproject_trajectories(conn, winners)
    store_offsets(conn, consumer, offsets)
    return len(fresh)


def insert_events(conn: Connection, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Insert `rows` (`data` as JSON text) into `events`, skipping copies already there; the rows inserted.

    Copies already stored are looked up first (one indexed query per batch) so that the
    insert itself is a plain executemany; `ON CONFLICT DO NOTHING` still guards it.
    """
    if not rows:
        return []
    rows = _unique_by(rows, ("id", "source"))
    existing = _stored_copies(conn, [row["id"] for row in rows])
    new_rows = [row for row in rows if copy_key(row) not in existing]
    if new_rows:
        _execute_many(conn, _statement(conn.dialect, "events", tuple(new_rows[0]), None), new_rows)
    return new_rows


def _stored_copies(conn: Connection, ids: list[str]) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for chunk in _chunks(ids):
        query = select(EventRow.id, EventRow.source).where(EventRow.id.in_(chunk))
        found.update((event_id, source) for event_id, source in conn.execute(query))
    return found


def rerun_trajectories(conn: Connection, rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """The trajectories of these (stored) rows that more than one run wrote: their rollout events'
    sources and the stored `trajectory.started` copies (every run starts at seq 0) name two writers."""
    sources: dict[str, set[str]] = {}
    for row in rows:
        if row["trajectory_id"] and row["type"] in ROLLOUT_EVENT_TYPES:
            sources.setdefault(row["trajectory_id"], set()).add(row["source"])
    for chunk in _chunks(list(sources)):
        query = select(EventRow.trajectory_id, EventRow.source).where(
            EventRow.trajectory_id.in_(chunk), EventRow.seq == 0, EventRow.type == "trajectory.started"
        )
        for trajectory_id, source in conn.execute(query):
            sources[trajectory_id].add(source)
    return {trajectory_id for trajectory_id, found in sources.items() if len(found) > 1}


def winning_copies(conn: Connection, trajectory_ids: set[str]) -> dict[str, list[WireEvent]]:
    """Per trajectory, the stored copies that fold and replay keep (`dedupe_by_seq`), in seq order.

    Copies are read in Kafka order, the order the topics give them. A trajectory whose copies
    cannot be folded together (two different ids at one seq) is left out: its new rows are
    projected as they come, as for any malformed trajectory."""
    copies: dict[str, list[WireEvent]] = {}
    columns = [EventRow.__table__.c[name] for name in (*Event.ENVELOPE_FIELDS, "data")]
    for chunk in _chunks(sorted(trajectory_ids)):
        query = (
            select(*columns)
            .where(EventRow.trajectory_id.in_(chunk), EventRow.type.in_(ROLLOUT_EVENT_TYPES))
            .order_by(EventRow.kafka_topic, EventRow.kafka_partition, EventRow.kafka_offset)
        )
        for row in conn.execute(query).mappings():
            copies.setdefault(row["trajectory_id"], []).append(wire_from_row(row))
    winners: dict[str, list[WireEvent]] = {}
    for trajectory_id, events in copies.items():
        try:
            kept = dedupe_by_seq(events)
        except MalformedTrajectory:
            continue
        winners[trajectory_id] = [kept[seq] for seq in sorted(kept)]
    return winners


def reproject_trajectories(conn: Connection, winners: Mapping[str, list[WireEvent]]) -> None:
    """Replace the trajectory projections of these trajectories with those of their winning copies."""
    if not winners:
        return
    for chunk in _chunks(sorted(winners)):
        for name in TRAJECTORY_PROJECTIONS:
            table = _TABLES[name]
            conn.execute(table.delete().where(table.c.trajectory_id.in_(chunk)))
    upsert_projections(
        conn, (row for events in winners.values() for event in events for row in projection_rows(event))
    )


def _chunks(items: list[str]) -> Iterable[list[str]]:
    """`items` in slices of `ID_LOOKUP_CHUNK` (one `IN (...)` each)."""
    for first in range(0, len(items), ID_LOOKUP_CHUNK):
        yield items[first : first + ID_LOOKUP_CHUNK]


def upsert_projections(conn: Connection, rows: Iterable[ProjectionRow]) -> None:
    """Upsert projection rows, one statement per (table, column set); later rows win on a key."""
    buckets: dict[tuple[str, tuple[str, ...], tuple[str, ...]], list[dict[str, Any]]] = {}
    for row in rows:
        buckets.setdefault((row.table, row.key, tuple(row.values)), []).append(row.values)
    for (table_name, key, columns), values in buckets.items():
        # PostgreSQL refuses one statement touching a row twice; keep the last value per key.
        _execute_many(
            conn, _statement(conn.dialect, table_name, columns, key), _unique_by(values, key, "last")
        )


def store_offsets(conn: Connection, consumer: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """Set `consumer`'s next offset for each (topic, partition)."""
    if not offsets:
        return
    now = time.time_ns()
    rows = [
        {"consumer": consumer, "topic": topic, "partition": part, "next_offset": offset, "updated_ns": now}
        for (topic, part), offset in offsets.items()
    ]
    key = ("consumer", "topic", "partition")
    _execute_many(conn, _statement(conn.dialect, "consumer_offsets", tuple(rows[0]), key), rows)


def load_offsets(conn: Connection, consumer: str) -> dict[tuple[str, int], int]:
    """`consumer`'s stored next offsets by (topic, partition)."""
    query = select(ConsumerOffset.topic, ConsumerOffset.partition, ConsumerOffset.next_offset).where(
        ConsumerOffset.consumer == consumer
    )
    return {(topic, partition): offset for topic, partition, offset in conn.execute(query)}


@dataclass(frozen=True)
class _Statement:
    sql: str
    order: tuple[str, ...] | None  # parameter order for positional drivers (sqlite), None for named


@lru_cache(maxsize=256)
def _statement(
    dialect: Dialect, table_name: str, columns: tuple[str, ...], key: tuple[str, ...] | None
) -> _Statement:
    """INSERT of `columns` into `table_name`: on a conflict, nothing (key None) or update the non-key columns.

    JSON columns take the JSON text the rows already hold (a cast to JSONB on PostgreSQL)."""
    table = _TABLES[table_name]
    postgres = dialect.name == "postgresql"
    if dialect.name not in ("postgresql", "sqlite"):
        raise ValueError(f"the event store supports sqlite and postgresql, not {dialect.name}")
    insert = postgresql.insert(table) if postgres else sqlite.insert(table)
    values = {name: _bind(name, isinstance(table.c[name].type, JSON), postgres) for name in columns}
    stmt = insert.values(values)
    if key is None:
        stmt = stmt.on_conflict_do_nothing()
    else:
        updates = {name: stmt.excluded[name] for name in columns if name not in key}
        stmt = stmt.on_conflict_do_update(index_elements=list(key), set_=updates)
    compiled = stmt.compile(dialect=dialect)
    return _Statement(str(compiled), tuple(compiled.positiontup or ()) if compiled.positional else None)


def _bind(name: str, is_json: bool, postgres: bool) -> Any:
    if not is_json:
        return bindparam(name)
    text = bindparam(name, type_=Text)
    return cast(text, JSONB) if postgres else text


def _execute_many(conn: Connection, statement: _Statement, rows: list[dict[str, Any]]) -> None:
    """Run `statement` for every row on the driver: these rows hold plain values, so
    SQLAlchemy's per-row parameter processing (most of the sink's SQL time) is skipped.

    PostgreSQL: psycopg's executemany (pipelined). SQLite: multi-row `VALUES` of up to
    `ROWS_PER_STATEMENT` rows, because sqlite3's executemany releases and re-takes the
    GIL for every row, and each re-take waits behind the sink's decoding thread."""
    if statement.order is None:
        conn.exec_driver_sql(statement.sql, rows)  # type: ignore[arg-type]
        return
    values = itemgetter(*statement.order)
    per_statement = max(1, min(ROWS_PER_STATEMENT, SQLITE_VARIABLES // len(statement.order)))
    for first in range(0, len(rows), per_statement):
        chunk = rows[first : first + per_statement]
        params = (
            tuple(chain.from_iterable(map(values, chunk)))
            if len(statement.order) > 1
            else tuple(map(values, chunk))
        )
        conn.exec_driver_sql(_multi_row(statement.sql, len(chunk)), params)


@lru_cache(maxsize=256)
def _multi_row(sql: str, rows: int) -> str:
    """`INSERT ... VALUES (?, ...) ...` with its values group repeated `rows` times."""
    head, values, tail = sql.partition(" VALUES ")
    end = tail.index(")") + 1  # SQLite's group is "(?, ?, ...)": no parenthesis inside
    return head + values + ", ".join([tail[:end]] * rows) + tail[end:]


def _unique_by(rows: list[dict[str, Any]], key: tuple[str, ...], keep: str = "first") -> list[dict[str, Any]]:
    """One row per `key` value, in first-seen order; the first or the last row of each key."""
    idents = list(map(itemgetter(*key), rows))  # itemgetter in C: this runs for every row of a batch
    if keep == "last":
        return list(dict(zip(idents, rows, strict=True)).values())
    if len(set(idents)) == len(rows):  # the usual case: no duplicates
        return rows
    unique: dict[Any, dict[str, Any]] = {}
    for ident, row in zip(idents, rows, strict=True):
        unique.setdefault(ident, row)
    return list(unique.values())
