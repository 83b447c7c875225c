"""`rollstream db upgrade|current`: the event store's schema (alembic migrations in `migrations/`)."""

from __future__ import annotations

from typing import Annotated

import typer
from sqlalchemy.exc import SQLAlchemyError

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from streams.store import StoreError, open_readonly
from streams.store.migrate import create_store_engine, current_revision, head_revision
from streams.store.migrate import upgrade as migrate

app = typer.Typer(help="The SQL event store's schema.", no_args_is_help=True)

DbUrl = Annotated[str | None, typer.Option("--db", help="database URL (default: the config's db_url)")]


@app.command()
def upgrade(db: DbUrl = None, config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Create or migrate the event store to the newest schema (harmless when current)."""
    url = db or read_config(config, overrides).db_url
    try:
        engine = create_store_engine(url)
        before = current_revision(engine)
        migrate(engine)
        after = current_revision(engine)
        engine.dispose()
    except (StoreError, SQLAlchemyError) as error:
        fail(f"cannot migrate {url}: {error}")
    if before == after:
        console.print(f"{url}: already at {after}")
    else:
        console.print(f"{url}: {before or '(empty)'} -> {after}")


@app.command()
def current(db: DbUrl = None, config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Print the schema revision of the database and the newest one; exit 1 when behind."""
    url = db or read_config(config, overrides).db_url
    try:
        engine = open_readonly(url)
        revision = current_revision(engine)
        engine.dispose()
    except (StoreError, SQLAlchemyError) as error:
        fail(f"cannot read {url}: {error}")
    head = head_revision()
    console.print(f"{url}: at {revision or '(empty)'}, newest {head}")
    if revision != head:
        fail("the schema is behind: run `rollstream db upgrade`")
