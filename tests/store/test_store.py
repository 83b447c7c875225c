"""The event store without Kafka: migrations, batches, projections, idempotence, read-only access."""

from __future__ import annotations

import fcntl
import sqlite3
import threading
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import DBAPIError

from streams.eventgen import generate_events
from streams.store import StoredEvent, load_offsets, open_readonly, open_store, write_batch
from streams.store.migrate import current_revision, head_revision
from streams.store.models import Base
from streams.store.wire import to_wire
from tests.store.batches import ends, positioned, write_in_batches
from tests.store.expect import assert_events_stored, assert_projections, rows, scalar

PROJECTIONS = ("trajectories", "turns", "tool_calls", "sandbox_lifecycle", "weight_versions", "trainer_steps")


def test_migrations_create_the_modelled_schema_on_an_empty_database(db_url: str) -> None:
    engine = open_store(db_url)
    assert current_revision(engine) == head_revision() is not None
    names = set(inspect(engine).get_table_names())
    assert {"events", "consumer_offsets", *PROJECTIONS} <= names
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        assert compare_metadata(context, Base.metadata) == []
    engine.dispose()
    again = open_store(db_url)  # already at head: a no-op
    assert current_revision(again) == head_revision()
    again.dispose()


def test_every_column_round_trips_and_projections_match(db_url: str) -> None:
    events = generate_events(3000, seed=11)
    stored = positioned(events)
    write_in_batches(db_url, stored)
    engine = open_store(db_url)
    assert_events_stored(engine, events)
    assert_projections(engine, events)
    assert load_offsets(engine.connect(), "sink") == ends(stored)
    engine.dispose()


def test_rewriting_batches_changes_nothing(db_url: str) -> None:
    events = generate_events(1200, seed=3)
    stored = positioned(events)
    write_in_batches(db_url, stored, size=700)
    engine = open_store(db_url)
    before = {
        table: rows(engine, f"SELECT * FROM {table} ORDER BY 1, 2") for table in ("events", *PROJECTIONS)
    }
    engine.dispose()
    write_in_batches(db_url, stored, size=300)  # replayed with other batch boundaries
    engine = open_store(db_url)
    after = {
        table: rows(engine, f"SELECT * FROM {table} ORDER BY 1, 2") for table in ("events", *PROJECTIONS)
    }
    assert after == before
    engine.dispose()


def test_a_batch_of_stored_and_new_events_stores_and_projects_only_the_new(db_url: str) -> None:
    """The writer takes its insert's row count as proof that no copy was stored before; a batch
    where some were (a re-read) is rolled back to its savepoint and written again without them."""
    events = generate_events(1200, seed=8)
    stored = positioned(events)
    engine = open_store(db_url)
    with engine.begin() as conn:
        assert write_batch(conn, stored[:500], ends(stored[:500]), "sink") == 500
    with engine.begin() as conn:  # the first 500 read again, in one batch with 700 new ones
        assert write_batch(conn, stored, ends(stored), "sink") == 700
    assert_events_stored(engine, events)
    assert_projections(engine, events)
    assert load_offsets(engine.connect(), "sink") == ends(stored)
    engine.dispose()


def test_a_duplicate_event_id_keeps_the_first_copy_everywhere(db_url: str) -> None:
    events = [e for e in generate_events(400, seed=5) if e.type == "turn.generated"][:3]
    first = events[0]
    rewritten = first.model_copy(update={"data": first.data.model_copy(update={"engine_id": "engine-late"})})
    stored = positioned(events)
    engine = open_store(db_url)
    with engine.begin() as conn:
        assert write_batch(conn, stored, ends(stored), "sink") == 3
    with engine.begin() as conn:  # the same id re-emitted at a later offset with other content
        late = StoredEvent(to_wire(rewritten), stored[0].topic, stored[0].partition, 99)
        assert write_batch(conn, [late], {(late.topic, late.partition): 100}, "sink") == 0
    assert scalar(engine, "SELECT COUNT(*) FROM events") == 3
    assert (
        scalar(engine, f"SELECT engine_id FROM turns WHERE event_id = '{first.id}'") == first.data.engine_id
    )  # type: ignore[attr-defined]
    assert load_offsets(engine.connect(), "sink")[(late.topic, late.partition)] == 100
    engine.dispose()


def test_read_only_engine_reads_but_cannot_write(db_url: str) -> None:
    write_in_batches(db_url, positioned(generate_events(50)))
    reader = open_readonly(db_url)
    assert scalar(reader, "SELECT COUNT(*) FROM events") == 50
    with pytest.raises(DBAPIError), reader.begin() as conn:
        conn.execute(text("DELETE FROM events"))
    assert scalar(reader, "SELECT COUNT(*) FROM events") == 50
    reader.dispose()


def test_processes_opening_an_empty_store_at_once_take_turns_migrating(db_url: str) -> None:
    errors: list[BaseException] = []

    def open_and_close() -> None:
        try:
            open_store(db_url).dispose()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=open_and_close) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    engine = open_store(db_url)
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_opening_an_empty_store_waits_for_a_connection_switching_it_to_wal(sqlite_url: str) -> None:
    """The collision behind "database is locked" at start-up, made deterministic: another
    connection is half-way through switching the new file to WAL (it holds the file's write lock,
    as SQLite's switch does between its read lock and its exclusive lock). SQLite's busy timeout
    does not cover that upgrade, so an open at that moment used to fail at once; now it waits on
    the switch lock beside the database and then migrates."""
    path = Path(sqlite_url.removeprefix("sqlite:///"))
    switcher = sqlite3.connect(path, isolation_level=None)
    errors: list[BaseException] = []

    def open_and_close() -> None:
        try:
            open_store(sqlite_url).dispose()
        except BaseException as error:
            errors.append(error)

    with path.with_name(f"{path.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the switch lock, held as every switching connection holds it
        switcher.execute("BEGIN IMMEDIATE")  # the write lock of a switch in progress
        opener = threading.Thread(target=open_and_close)
        opener.start()
        opener.join(timeout=1.5)
        assert errors == [] and opener.is_alive(), f"the open did not wait for the switch: {errors}"
        switcher.execute("COMMIT")
        assert switcher.execute("PRAGMA journal_mode = WAL").fetchone() == ("wal",)
        fcntl.flock(lock, fcntl.LOCK_UN)
    opener.join(timeout=120)
    switcher.close()
    assert errors == [] and not opener.is_alive()
    engine = open_store(sqlite_url)
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()
