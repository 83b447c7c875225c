"""Open the event store: engines tuned per backend, alembic migrations applied.

`open_store(url)` is what every writer and reader calls: it creates the SQLite
file's directory when needed, runs the alembic migrations packaged in
`migrations/` up to head (a no-op when current) and returns the engine.

SQLite engines use WAL (readers never block the one writer and vice versa),
`synchronous=NORMAL` (durable across a killed process; only an OS crash can
lose the last commits), a busy timeout, and an explicit BEGIN per transaction
so that a transaction really spans every statement in it. Writing engines get
a page cache of `StoreSettings.sqlite_cache_mib` (SQLite's default, 2 MiB, is
smaller than one sink batch). Switching a new database to WAL is serialised
across processes by an exclusive lock on the file `<database>.lock`
(`_switch_to_wal`): SQLite's busy timeout does not cover that switch.
`open_readonly(url)` is the engine for `rollstream sql`: SQLite opened with
`mode=ro`, PostgreSQL sessions with `default_transaction_read_only`.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

from streams.settings import StoreSettings

SQLITE_BUSY_TIMEOUT_MS = 30_000
MIGRATION_LOCK_KEY = 0x526F6C6C  # PostgreSQL advisory lock held while migrating (SQLite: BEGIN IMMEDIATE)
WAL_LOCK_POLL_S = 0.01  # how often a connection waiting to switch a new database to WAL retries the file lock
SQLITE_CACHE_MIB: int = StoreSettings.model_fields["sqlite_cache_mib"].default
# Parsed statements a SQLite connection keeps (sqlite3's default is 128): the writer's multi-row
# statements come in ~10 sizes per table and column set (`streams.store.writer._statement_sizes`).
SQLITE_CACHED_STATEMENTS = 512


class StoreError(RuntimeError):
    """The event store URL or database cannot be used; the message says what to do."""


def open_store(url: str, sqlite_cache_mib: int = SQLITE_CACHE_MIB) -> Engine:
    """An engine on the event store at `url`, migrated to the newest schema."""
    engine = create_store_engine(url, sqlite_cache_mib)
    upgrade(engine)
    return engine


def create_store_engine(url: str, sqlite_cache_mib: int = SQLITE_CACHE_MIB) -> Engine:
    """A read-write engine for `url` (sqlite or postgresql), without migrating."""
    parsed = _parse(url)
    if parsed.get_backend_name() == "sqlite":
        _ensure_parent_dir(parsed)
        engine = create_engine(
            parsed,
            connect_args={
                "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000,
                "cached_statements": SQLITE_CACHED_STATEMENTS,
            },
        )
        _configure_sqlite(engine, readonly=False, wal_lock=_wal_lock_path(parsed), cache_mib=sqlite_cache_mib)
        return engine
    return create_engine(parsed, pool_pre_ping=True)


def open_readonly(url: str) -> Engine:
    """An engine that cannot write: SQLite `mode=ro`, PostgreSQL read-only transactions."""
    parsed = _parse(url)
    if parsed.get_backend_name() == "sqlite":
        path = parsed.database
        if not path or path == ":memory:" or not Path(path).exists():
            where = path or "(memory)"
            raise StoreError(f"no event store at {where}; run `rollstream db upgrade` or the sink")
        uri = f"{Path(path).resolve().as_uri()}?mode=ro"  # as_uri percent-encodes odd characters
        engine = create_engine("sqlite://", creator=lambda: _sqlite_connect_ro(uri), poolclass=NullPool)
        _configure_sqlite(engine, readonly=True)
        return engine
    return create_engine(
        parsed, connect_args={"options": "-c default_transaction_read_only=on"}, poolclass=NullPool
    )


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply the packaged migrations up to `revision` in one transaction."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # two processes migrating at once take turns
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        config = alembic_config()
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None: never migrated)."""
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def head_revision() -> str | None:
    """The newest revision the packaged migrations know."""
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def alembic_config() -> AlembicConfig:
    """Alembic config whose script location is the installed `migrations` package."""
    config = AlembicConfig()
    config.set_main_option("script_location", str(migrations_dir()))
    return config


def migrations_dir() -> Path:
    """The directory of the `migrations` package (a regular or, in editable installs, namespace package)."""
    spec = importlib.util.find_spec("migrations")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        if (Path(location) / "env.py").is_file():
            return Path(location)
    raise StoreError("the `migrations` package (alembic env.py) is not installed; reinstall rollstream")


def _parse(url: str) -> URL:
    try:
        parsed = make_url(url)
    except Exception as error:
        raise StoreError(
            f"{url!r} is not a database URL ({error}); use sqlite:///path or "
            "postgresql+psycopg://user@host:port/db"
        ) from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise StoreError(f"unsupported database {parsed.get_backend_name()!r}: use sqlite or postgresql")
    return parsed


def _file_database(url: URL) -> Path | None:
    """The database file of a SQLite URL (None: in memory, or a `file:` URI left to SQLite)."""
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        return Path(url.database)
    return None


def _ensure_parent_dir(url: URL) -> None:
    database = _file_database(url)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)


def _wal_lock_path(url: URL) -> Path | None:
    database = _file_database(url)
    return database.with_name(f"{database.name}.lock") if database is not None else None


def _sqlite_connect_ro(uri: str) -> Any:
    import sqlite3

    return sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False)


def _configure_sqlite(
    engine: Engine, *, readonly: bool, wal_lock: Path | None = None, cache_mib: int | None = None
) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        if not readonly:
            _switch_to_wal(cursor, wal_lock)
            cursor.execute("PRAGMA synchronous = NORMAL")
        if cache_mib is not None:
            cursor.execute(f"PRAGMA cache_size = -{cache_mib * 1024}")  # negative: KiB, not pages
        else:
            cursor.execute("PRAGMA query_only = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")


def _switch_to_wal(cursor: Any, lock_path: Path | None) -> None:
    """Put the database in WAL mode, one connection at a time.

    Switching a rollback-journal database (a new, empty store) to WAL takes a read lock, then
    upgrades it to the exclusive lock. SQLite never calls the busy handler for that upgrade (two
    connections each holding the read lock would wait on each other forever), so a connection
    that switches at the same moment as another fails at once with "database is locked",
    whatever the busy timeout: processes opening an empty store together collided. An exclusive
    file lock beside the database makes the switches take turns; the later ones find WAL already
    set. A database already in WAL (persistent in its header) needs neither switch nor lock.
    """
    if cursor.execute("PRAGMA journal_mode").fetchone()[0] == "wal":
        return
    with _exclusive_file_lock(lock_path):
        cursor.execute("PRAGMA journal_mode = WAL")


@contextlib.contextmanager
def _exclusive_file_lock(path: Path | None) -> Iterator[None]:
    """flock(2) on `path` across processes and threads, waiting up to the busy timeout."""
    if path is None:  # in memory (nothing shared), or a `file:` URI whose path is left to SQLite
        yield
        return
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
    with path.open("a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"{path} stayed locked for {SQLITE_BUSY_TIMEOUT_MS / 1000:.0f} s: another process "
                        f"is stuck opening this event store; find it with `fuser {path}`, stop it, retry"
                    ) from None
                time.sleep(WAL_LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
