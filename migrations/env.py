"""Alembic environment: runs on the connection `streams.store.migrate` passes in.

When run from the `alembic` command line instead, it connects to
`sqlalchemy.url` of the ini file. SQLite gets batch mode (ALTER TABLE there is
done by copying the table), so every revision runs on both backends.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from streams.store.models import Base


def run_on(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    engine = create_engine(context.config.get_main_option("sqlalchemy.url") or "")
    with engine.connect() as own:
        run_on(own)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_online()
