"""Committed JSON Schemas: records written under them still decode, and a breaking
model change (new required field, changed type, removed field) is caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import create_model

from streams.events import PAYLOADS
from streams.payloads import ToolExecuted, TurnGenerated
from streams.schema_files import (
    SCHEMA_DIR,
    compatibility_problems,
    example_problems,
    load_schema,
    schema_drift,
    schema_instances,
    write_schemas,
)

COMMITTED = sorted(path for path in SCHEMA_DIR.glob("*.json") if path.name != "envelope.json")


def test_every_type_has_a_committed_schema_and_example() -> None:
    assert {load_schema(path)["x-event-type"] for path in COMMITTED} == set(PAYLOADS)
    examples = {path.name.rsplit(".v", 1)[0] for path in (SCHEMA_DIR / "examples").glob("*.json")}
    assert examples == set(PAYLOADS)


@pytest.mark.parametrize("path", COMMITTED, ids=lambda path: path.stem)
def test_records_under_committed_schema_still_decode(path: Path) -> None:
    assert compatibility_problems(load_schema(path)) == []


def test_committed_example_records_still_decode() -> None:
    assert example_problems() == []


def test_new_required_field_is_caught() -> None:
    schema = load_schema(SCHEMA_DIR / "turn.generated.json")
    changed = create_model("TurnGeneratedV2", __base__=TurnGenerated, sampler=(str, ...))
    problems = compatibility_problems(schema, changed)
    assert problems and "sampler" in " ".join(problems)


def test_changed_type_is_caught() -> None:
    schema = load_schema(SCHEMA_DIR / "tool.executed.json")
    changed = create_model("ToolExecutedV2", __base__=ToolExecuted, output_bytes=(str, ...))
    assert compatibility_problems(schema, changed)


def test_removed_field_is_caught() -> None:
    schema = load_schema(SCHEMA_DIR / "tool.executed.json")
    fields = {name: (info.annotation, info) for name, info in ToolExecuted.model_fields.items()}
    del fields["timed_out"]
    changed = create_model("ToolExecutedV2", __config__=ToolExecuted.model_config, **fields)  # type: ignore[call-overload]
    assert compatibility_problems(schema, changed)


def test_added_optional_field_is_compatible() -> None:
    schema = load_schema(SCHEMA_DIR / "tool.executed.json")
    changed = create_model("ToolExecutedV2", __base__=ToolExecuted, cwd=(str | None, None))
    assert compatibility_problems(schema, changed) == []


def test_instances_cover_required_and_optional_fields() -> None:
    schema = load_schema(SCHEMA_DIR / "tool.executed.json")
    instances = schema_instances(schema)
    assert set(instances["full"]) == set(schema["properties"])
    assert set(instances["required"]) == set(schema["required"])


def test_drift_is_reported_and_write_fixes_it(tmp_path: Path) -> None:
    assert write_schemas(tmp_path)
    assert schema_drift(tmp_path) == []
    path = tmp_path / "tool.executed.json"
    schema = json.loads(path.read_text())
    schema["required"].remove("command")
    path.write_text(json.dumps(schema))
    (tmp_path / "sandbox.ready.json").unlink()
    drift = schema_drift(tmp_path)
    assert "tool.executed.json: differs from the model" in drift
    assert "sandbox.ready.json: missing" in drift
    written = write_schemas(tmp_path)
    assert {p.name for p in written} == {"tool.executed.json", "sandbox.ready.json"}
    assert schema_drift(tmp_path) == []
