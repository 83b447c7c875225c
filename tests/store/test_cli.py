"""`rollstream sql` and `rollstream db` on both backends: read-only queries, refused writes, migrations."""

from __future__ import annotations

import csv
import io
import json

import pytest
import typer
from typer.testing import CliRunner

from rollstream.commands import db as db_commands
from rollstream.commands.sql import command as sql_command
from streams.eventgen import generate_events
from streams.store import open_readonly
from streams.store.migrate import head_revision
from streams.store.readonly import WriteRefusedError, check_read_only
from tests.store.batches import positioned, write_in_batches
from tests.store.expect import scalar

runner = CliRunner()
sql_app = typer.Typer()
sql_app.command()(sql_command)


def sql(*args: str) -> tuple[int, str]:
    result = runner.invoke(sql_app, list(args))
    return result.exit_code, result.output


@pytest.fixture
def filled_url(db_url: str) -> str:
    write_in_batches(db_url, positioned(generate_events(300, seed=2)))
    return db_url


def test_sql_prints_query_results_as_table_csv_and_json(filled_url: str) -> None:
    query = "SELECT type, COUNT(*) AS n FROM events GROUP BY type ORDER BY type"
    code, out = sql(query, "--db", filled_url, "--format", "json")
    assert code == 0, out
    counts = {row["type"]: row["n"] for row in json.loads(out)}
    assert sum(counts.values()) == 300 and "turn.generated" in counts
    code, out = sql(query, "--db", filled_url, "--format", "csv")
    assert code == 0, out
    assert {row["type"]: int(row["n"]) for row in csv.DictReader(io.StringIO(out))} == counts
    code, out = sql(query, "--db", filled_url)
    assert code == 0 and "turn.generated" in out and f"{len(counts)} rows" in out


WRITES = (
    "DELETE FROM events",
    "  insert into consumer_offsets values ('x', 't', 0, 0, 0)",
    "UPDATE trajectories SET reward = 1",
    "DROP TABLE events",
    "SELECT 1; DELETE FROM events",
    "COMMIT; BEGIN READ WRITE; DELETE FROM events",
    "/* comment */ ALTER TABLE events ADD COLUMN x INT",
)


def test_sql_refuses_statements_that_write(filled_url: str) -> None:
    for statement in WRITES:
        code, out = sql(statement, "--db", filled_url)
        assert code == 2, f"{statement!r} was not refused: {out}"
        assert "refused" in out or "one statement" in out
    engine = open_readonly(filled_url)
    assert scalar(engine, "SELECT COUNT(*) FROM events") == 300
    engine.dispose()


def test_sql_refuses_a_write_hidden_in_a_cte_at_the_database(filled_url: str) -> None:
    """The keyword check passes `WITH ... DELETE`; the read-only connection refuses it."""
    code, out = sql("WITH doomed AS (SELECT id FROM events) DELETE FROM events", "--db", filled_url)
    assert code == 2 and "read-only" in out
    engine = open_readonly(filled_url)
    assert scalar(engine, "SELECT COUNT(*) FROM events") == 300
    engine.dispose()


def test_read_only_check_ignores_semicolons_and_keywords_inside_literals_and_comments() -> None:
    assert check_read_only("SELECT 'a;b', \"delete;\" FROM events -- ; DROP\n;").startswith("SELECT")
    assert check_read_only("WITH x AS (SELECT $$;$$) SELECT * FROM x")
    with pytest.raises(WriteRefusedError, match="one statement"):
        check_read_only("SELECT 1; SELECT 2")
    with pytest.raises(WriteRefusedError, match="empty"):
        check_read_only(" -- nothing\n ;")


def test_db_upgrade_then_current(db_url: str) -> None:
    app = typer.Typer()
    app.add_typer(db_commands.app, name="db")
    head = head_revision()  # the newest packaged migration
    upgraded = runner.invoke(app, ["db", "upgrade", "--db", db_url])
    assert upgraded.exit_code == 0, upgraded.output
    assert f"-> {head}" in upgraded.output
    again = runner.invoke(app, ["db", "upgrade", "--db", db_url])
    assert again.exit_code == 0 and f"already at {head}" in again.output
    current = runner.invoke(app, ["db", "current", "--db", db_url])
    assert current.exit_code == 0 and f"at {head}" in current.output
