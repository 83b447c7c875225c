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

The usual batch costs three statements besides its projections: the insert
(its row count proves no copy was stored before, so no lookup precedes it), one
query that returns only trajectories another run started (none, usually), and
the offsets. Inserts and upserts are SQLAlchemy Core (`insert().on_conflict_*`
of the sqlite and postgresql dialects), compiled once and run on the driver
(psycopg's pipelined executemany; on SQLite one multi-row `VALUES` per batch):
the rows already hold plain values and JSON text, so per-row parameter
processing is skipped. Each statement the sink's commit thread runs, and each
row it fetches, re-takes the GIL from the thread decoding the next batch, so
their number is kept small.
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
# Most rows per multi-row statement on SQLite; a power of two, see `_statement_sizes`.
ROWS_PER_STATEMENT = 512
SQLITE_VARIABLES = 32_766  # SQLite's default bound-parameter limit since 3.32


@dataclass(frozen=True)
class PreparedBatch:
    """A batch's `events` rows and their projection rows, built outside the transaction.

    Plain dicts of plain values and slotted rows only: the sink drops the decoded events
    once these are built, so the garbage collector has next to nothing to scan while the
    batch waits for its commit. `owners[i]` is the index in `event_rows` of the event that
    `projections[i]` comes from."""

    event_rows: list[dict[str, Any]]
    projections: list[ProjectionRow]
    owners: list[int]


def prepare_batch(events: Iterable[StoredEvent]) -> PreparedBatch:
    """The rows of `events` (pure; the sink builds them while the previous batch commits)."""
    rows: list[dict[str, Any]] = []
    projections: list[ProjectionRow] = []
    owners: list[int] = []
    for index, stored in enumerate(events):
        rows.append(event_row(stored))
        for projection in projection_rows(stored.event):
            projections.append(projection)
            owners.append(index)
    return PreparedBatch(rows, projections, owners)


def write_batch(
    conn: Connection,
    batch: Sequence[StoredEvent] | PreparedBatch,
    offsets: Mapping[tuple[str, int], int],
    consumer: str,
) -> int:
    """Store the events and set `consumer`'s next offsets (inside `engine.begin()`); the new events."""
    prepared = batch if isinstance(batch, PreparedBatch) else prepare_batch(batch)
    rows = prepared.event_rows
    fresh = insert_events(conn, rows)
    rerun = rerun_trajectories(conn, (rows[index] for index in fresh))
    winners = winning_copies(conn, rerun)
    fresh_set = set(fresh)
    upsert_projections(
        conn,
        (
            projection
            for projection, owner in zip(prepared.projections, prepared.owners, strict=True)
            if owner in fresh_set and rows[owner]["trajectory_id"] not in winners
        ),
    )
    reproject_trajectories(conn, winners)
    store_offsets(conn, consumer, offsets)
    return len(fresh)


def insert_events(conn: Connection, rows: list[dict[str, Any]]) -> list[int]:
    """Insert `rows` (`data` as JSON text) into `events`, skipping copies already there; the
    indices in `rows` of those inserted (the first of each (id, source) in the batch).

    A batch usually holds no copy stored before, so it is inserted as it is, inside a savepoint:
    when the insert's row count says every row went in, no lookup was needed. Otherwise (a sink
    re-reading what it stored, a writer re-emitting an event it had written) the savepoint is
    rolled back, the copies already stored are looked up, and only the others are inserted;
    `ON CONFLICT DO NOTHING` still guards the insert.
    """
    if not rows:
        return []
    firsts = _first_of_each(rows, ("id", "source"))
    candidates = rows if len(firsts) == len(rows) else [rows[index] for index in firsts]
    statement = _statement(conn.dialect, "events", tuple(rows[0]), None)
    savepoint = conn.begin_nested()
    if _execute_many(conn, statement, candidates) == len(candidates):
        savepoint.commit()
        return firsts
    savepoint.rollback()
    existing = _stored_copies(conn, [row["id"] for row in candidates])
    fresh = [index for index in firsts if (rows[index]["id"], rows[index]["source"]) not in existing]
    if fresh:
        _execute_many(conn, statement, [rows[index] for index in fresh])
    return fresh


def _stored_copies(conn: Connection, ids: list[str]) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for chunk in _chunks(ids):
        query = select(EventRow.id, EventRow.source).where(EventRow.id.in_(chunk))
        found.update((event_id, source) for event_id, source in conn.execute(query))
    return found


def rerun_trajectories(conn: Connection, rows: Iterable[Mapping[str, Any]]) -> set[str]:
    """The trajectories of these (stored) rows that more than one run wrote: two sources among
    their rollout rows, or a stored `trajectory.started` copy (every run starts at seq 0) from
    another source than theirs. The query returns only the latter (rare) trajectories, never a
    row per trajectory: on SQLite every row fetched re-takes the GIL from the decoding thread."""
    sources: dict[str, set[str]] = {}
    for row in rows:
        if row["trajectory_id"] and row["type"] in ROLLOUT_EVENT_TYPES:
            sources.setdefault(row["trajectory_id"], set()).add(row["source"])
    rerun = {trajectory_id for trajectory_id, found in sources.items() if len(found) > 1}
    pairs = [(trajectory_id, *found) for trajectory_id, found in sources.items() if len(found) == 1]
    first = 0
    for size in _statement_sizes(len(pairs), ID_LOOKUP_CHUNK):
        chunk = pairs[first : first + size]
        first += size
        sql = _started_elsewhere_sql(conn.dialect.paramstyle, size)
        rerun.update(row[0] for row in conn.exec_driver_sql(sql, tuple(chain.from_iterable(chunk))))
    return rerun


@lru_cache(maxsize=64)
def _started_elsewhere_sql(paramstyle: str, pairs: int) -> str:
    """The trajectories of `pairs` (trajectory id, source) bound pairs with a stored start from
    another source (plain SQL: compiling a `VALUES` of a thousand rows costs SQLAlchemy ~50 ms)."""
    mark = "?" if paramstyle == "qmark" else "%s"
    values = ", ".join([f"({mark}, {mark})"] * pairs)
    return (
        f"WITH batch (trajectory_id, source) AS (VALUES {values}) "
        "SELECT DISTINCT events.trajectory_id FROM batch JOIN events "
        "ON events.trajectory_id = batch.trajectory_id AND events.seq = 0 "
        "AND events.type = 'trajectory.started' AND events.source <> batch.source"
    )


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
        _execute_many(conn, _statement(conn.dialect, table_name, columns, key), _last_of_each(values, key))


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


def _execute_many(conn: Connection, statement: _Statement, rows: list[dict[str, Any]]) -> int:
    """Run `statement` for every row on the driver; the number of rows it changed.

    These rows hold plain values, so SQLAlchemy's per-row parameter processing (most of the
    sink's SQL time) is skipped. PostgreSQL: psycopg's executemany (pipelined). SQLite:
    multi-row `VALUES` (`_statement_sizes`), because sqlite3's executemany releases and
    re-takes the GIL for every row, and each re-take waits behind the sink's decoding thread."""
    if statement.order is None:
        return int(conn.exec_driver_sql(statement.sql, rows).rowcount)  # type: ignore[arg-type]
    values = itemgetter(*statement.order)
    most = min(ROWS_PER_STATEMENT, SQLITE_VARIABLES // len(statement.order))
    changed = first = 0
    for size in _statement_sizes(len(rows), most):
        chunk = rows[first : first + size]
        first += size
        params = (
            tuple(chain.from_iterable(map(values, chunk)))
            if len(statement.order) > 1
            else tuple(map(values, chunk))
        )
        changed += conn.exec_driver_sql(_multi_row(statement.sql, size), params).rowcount
    return changed


def _statement_sizes(rows: int, most: int) -> list[int]:
    """`rows` split into statements of few distinct sizes: the largest power of two up to `most`
    as often as it fits, then the powers of two of what is left (largest first).

    SQLite parses a multi-row `VALUES` anew for every text it has not cached, and parsing one
    costs 5-40x running it (~4-25 us a row against ~0.6); batches and projection buckets vary
    in size, so sizing each statement exactly would parse on every batch. With these sizes a
    connection meets at most ~10 texts per table and column set, all kept in its statement
    cache (`streams.store.migrate.SQLITE_CACHED_STATEMENTS`)."""
    top = 1 << (max(most, 1).bit_length() - 1)
    rest = rows % top
    return [top] * (rows // top) + [1 << bit for bit in reversed(range(rest.bit_length())) if rest >> bit & 1]


@lru_cache(maxsize=256)
def _multi_row(sql: str, rows: int) -> str:
    """`INSERT ... VALUES (?, ...) ...` with its values group repeated `rows` times."""
    head, values, tail = sql.partition(" VALUES ")
    end = tail.index(")") + 1  # SQLite's group is "(?, ?, ...)": no parenthesis inside
    return head + values + ", ".join([tail[:end]] * rows) + tail[end:]


def _first_of_each(rows: list[dict[str, Any]], key: tuple[str, ...]) -> list[int]:
    """The index of the first row of each `key` value, in order."""
    idents = list(map(itemgetter(*key), rows))
    if len(set(idents)) == len(rows):  # the usual case: no duplicates
        return list(range(len(rows)))
    firsts: dict[Any, int] = {}
    for index, ident in enumerate(idents):
        firsts.setdefault(ident, index)
    return list(firsts.values())


def _last_of_each(rows: list[dict[str, Any]], key: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per `key` value, the last one, in first-seen order."""
    idents = list(map(itemgetter(*key), rows))  # itemgetter in C: this runs for every row of a batch
    return list(dict(zip(idents, rows, strict=True)).values())
