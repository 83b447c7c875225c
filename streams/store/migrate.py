"""Open the event store: engines tuned per backend, alembic migrations applied.

`open_store(url)` is what every writer and reader calls: it creates the SQLite
file's directory when needed, runs the alembic migrations packaged in
`migrations/` up to head (a no-op when current) and returns the engine.

SQLite engines use WAL (readers never block the one writer and vice versa),
`synchronous=NORMAL` (durable across a killed process; only an OS crash can
lose the last commits), a busy timeout, and an explicit BEGIN per transaction
so that a transaction really spans every statement in it. `open_readonly(url)`
is the engine for `rollstream sql`: SQLite opened with `mode=ro`, PostgreSQL
sessions with `default_transaction_read_only`.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config as AlembicConfig
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

SQLITE_BUSY_TIMEOUT_MS = 30_000
MIGRATION_LOCK_KEY = 0x526F6C6C  # PostgreSQL advisory lock held while migrating (SQLite: BEGIN IMMEDIATE)


class StoreError(RuntimeError):
    """The event store URL or database cannot be used; the message says what to do."""


def open_store(url: str) -> Engine:
    """An engine on the event store at `url`, migrated to the newest schema."""
    engine = create_store_engine(url)
    upgrade(engine)
    return engine


def create_store_engine(url: str) -> Engine:
    """A read-write engine for `url` (sqlite or postgresql), without migrating."""
    parsed = _parse(url)
    if parsed.get_backend_name() == "sqlite":
        _ensure_parent_dir(parsed)
        engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        _configure_sqlite(engine, readonly=False)
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


def _ensure_parent_dir(url: URL) -> None:
    if url.database and url.database != ":memory:" and not url.database.startswith("file:"):
        Path(url.database).parent.mkdir(parents=True, exist_ok=True)


def _sqlite_connect_ro(uri: str) -> Any:
    import sqlite3

    return sqlite3.connect(uri, uri=True, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000, check_same_thread=False)


def _configure_sqlite(engine: Engine, *, readonly: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide where transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        if not readonly:
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
        else:
            cursor.execute("PRAGMA query_only = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")
