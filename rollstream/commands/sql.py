"""`rollstream sql "SELECT ..."`: query the event store read-only (rich table, CSV or JSON).

The database is opened read-only (SQLite `mode=ro`, PostgreSQL
`default_transaction_read_only`) and statements that are not a single read are
refused before they reach it.
"""

from __future__ import annotations

import csv
import json
import sys
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from streams.store import StoreError, open_readonly
from streams.store.readonly import WriteRefusedError, check_read_only

READ_ONLY_ERRORS = ("read-only transaction", "readonly database", "attempt to write", "query_only")


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def command(
    statement: Annotated[str, typer.Argument(help="one SELECT (or WITH/EXPLAIN/VALUES) statement")],
    db: Annotated[
        str | None, typer.Option("--db", help="database URL (default: the config's db_url)")
    ] = None,
    output: Annotated[
        OutputFormat, typer.Option("--format", "-f", help="table, csv or json")
    ] = OutputFormat.table,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Run one read-only query against the event store and print the result."""
    cfg = read_config(config, overrides)
    try:
        query = check_read_only(statement)
        engine = open_readonly(db or cfg.db_url)
    except (WriteRefusedError, StoreError) as error:
        fail(str(error), code=2)
    try:
        with engine.connect() as conn:
            result = conn.execute(text(query))
            columns = list(result.keys())
            rows = [tuple(row) for row in result]
    except DBAPIError as error:
        reason = str(error.orig)
        if any(marker in reason for marker in READ_ONLY_ERRORS):
            fail(f"refused: the event store is opened read-only ({reason.strip()})", code=2)
        fail(f"query failed: {reason.strip()}")
    except SQLAlchemyError as error:
        fail(f"query failed: {error}")
    finally:
        engine.dispose()
    _print(columns, rows, output)


def _print(columns: list[str], rows: list[tuple[Any, ...]], output: OutputFormat) -> None:
    if output is OutputFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    elif output is OutputFormat.json:
        print(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], default=str))
    else:
        table = Table(*columns, caption=f"{len(rows)} row{'s' if len(rows) != 1 else ''}")
        for row in rows:
            table.add_row(*("" if value is None else str(value) for value in row))
        console.print(table)
