"""`rollstream schemas write|check`: the committed JSON Schemas of every event type."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollstream.command_line import console, fail
from streams.eventgen import sample_event
from streams.schema_files import (
    SCHEMA_DIR,
    compatibility_problems,
    example_problems,
    load_schema,
    schema_drift,
    write_schemas,
)

app = typer.Typer(help="JSON Schemas of the event types (streams/schemas).", no_args_is_help=True)

EXAMPLE_TOKENS = 6  # token arrays of the committed example records stay short enough to read
Directory = Annotated[Path, typer.Option("--dir", help="schema directory")]


@app.command()
def write(directory: Directory = SCHEMA_DIR) -> None:
    """Regenerate the schemas from the models (and add missing example records)."""
    written = write_schemas(directory, example_of=lambda kind: sample_event(kind, 1, tokens=EXAMPLE_TOKENS))
    for path in written:
        console.print(f"wrote {path}")
    console.print(f"{len(written)} file(s) changed in {directory}")


@app.command()
def check(directory: Directory = SCHEMA_DIR) -> None:
    """Exit 1 when the committed schemas differ from the models or old records no longer decode."""
    problems = schema_drift(directory)
    for path in sorted(directory.glob("*.json")):
        schema = load_schema(path)
        if "x-event-type" in schema:
            problems += compatibility_problems(schema)
    problems += example_problems(directory)
    if problems:
        fail(
            "schemas are out of date or incompatible:\n  "
            + "\n  ".join(problems)
            + "\nrun `rollstream schemas write` after making the change backward compatible "
            "(optional fields with defaults, or bump SCHEMA_VERSION and add an upcaster)"
        )
    console.print(f"schemas in {directory} match the models; committed records still decode")
