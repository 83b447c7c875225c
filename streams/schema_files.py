"""Committed JSON Schemas of every event type, and the check that keeps old records readable.

`streams/schemas/<type>.json` is the JSON Schema of each payload (with
`x-event-type` and `x-schema-version`), `envelope.json` that of the envelope.
`write_schemas` regenerates them from the models; `schema_drift` lists where the
committed files differ (`rollstream schemas check` fails on any).

Compatibility: records written under a committed schema must still decode.
`schema_instances` generates instances from a schema (every property filled,
and only the required ones) and `compatibility_problems` decodes them with the
current models (through the upcasters when the version is older). A new required
field, a changed type or a removed field (payloads forbid unknown fields) shows
up as a problem. `streams/schemas/examples/<type>.v<version>.json` keeps one real
encoded event per type and version; `write_schemas` adds missing ones (made by
the `example_of` it is given: the CLI passes `streams.eventgen.sample_event`) and
never rewrites existing ones (they stand for data already on the log).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from streams.events import PAYLOADS, DecodeError, Event, decode_event, encode_event, event_from_dict

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
ENVELOPE = "envelope"


def payload_schema(kind: str) -> dict[str, Any]:
    model = PAYLOADS[kind]
    schema = model.model_json_schema(mode="validation")
    schema["x-event-type"] = kind
    schema["x-schema-version"] = model.SCHEMA_VERSION
    return schema


def envelope_schema() -> dict[str, Any]:
    return Event.model_json_schema(mode="validation")


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def expected_files() -> dict[str, str]:
    """File name -> content for every schema the models define now."""
    files = {f"{kind}.json": render(payload_schema(kind)) for kind in PAYLOADS}
    files[f"{ENVELOPE}.json"] = render(envelope_schema())
    return files


ExampleOf = Callable[[str], Event]  # an example event of a type, from a generator outside streams/


def write_schemas(directory: Path = SCHEMA_DIR, example_of: ExampleOf | None = None) -> list[Path]:
    """Write every schema (and, given `example_of`, a missing example per type/version); return the
    files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, content in expected_files().items():
        path = directory / name
        if not path.exists() or path.read_text() != content:
            path.write_text(content)
            written.append(path)
    for kind, model in PAYLOADS.items():
        example = directory / "examples" / f"{kind}.v{model.SCHEMA_VERSION}.json"
        if example_of is not None and not example.exists():
            example.parent.mkdir(parents=True, exist_ok=True)
            raw = json.loads(encode_event(example_of(kind)))
            example.write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
            written.append(example)
    return written


def schema_drift(directory: Path = SCHEMA_DIR) -> list[str]:
    """Where the committed schemas differ from the models ([] when they match)."""
    problems = []
    expected = expected_files()
    for name, content in expected.items():
        path = directory / name
        if not path.exists():
            problems.append(f"{name}: missing")
        elif path.read_text() != content:
            problems.append(f"{name}: differs from the model")
    for path in sorted(directory.glob("*.json")):
        if path.name not in expected:
            problems.append(f"{path.name}: no such event type any more")
    return problems


def compatibility_problems(schema: dict[str, Any], model: type[BaseModel] | None = None) -> list[str]:
    """Instances of a committed payload `schema` that the current code cannot read.

    With `model`, instances are validated against that model directly (tests use it
    to show a breaking change is caught); otherwise they are decoded as events."""
    kind, version = schema["x-event-type"], schema["x-schema-version"]
    problems = []
    for label, data in schema_instances(schema).items():
        try:
            if model is not None:
                model.model_validate(data)
            else:
                event_from_dict(_envelope_dict(kind, version, data))
        except ValidationError as error:
            where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors()[:3])
            problems.append(f"{kind} v{version} ({label} instance): {where}")
        except DecodeError as error:
            problems.append(f"{kind} v{version} ({label} instance): {error.reason}")
    return problems


def example_problems(directory: Path = SCHEMA_DIR) -> list[str]:
    """Committed example events that no longer decode."""
    problems = []
    for path in sorted((directory / "examples").glob("*.json")):
        try:
            decode_event(path.read_bytes())
        except DecodeError as error:
            problems.append(f"{path.name}: {error.reason}")
    return problems


def load_schema(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def _envelope_dict(kind: str, version: int, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": str(uuid.UUID(int=1)),
        "type": kind,
        "schema_version": version,
        "run_id": "run",
        "group_id": "g",
        "trajectory_id": "t",
        "task_id": "task",
        "seq": 0,
        "policy_version": 0,
        "time_ns": 0,
        "source": "schema-check",
        "causation_id": None,
        "data": data,
    }


# ---- instances from a JSON Schema ------------------------------------------------


def schema_instances(schema: dict[str, Any]) -> dict[str, Any]:
    """A 'full' instance (every property) and a 'required' one (required properties only)."""
    defs = schema.get("$defs", {})
    return {
        "full": _instance(schema, defs, full=True),
        "required": _instance(schema, defs, full=False),
    }


def _instance(schema: dict[str, Any], defs: dict[str, Any], *, full: bool) -> Any:
    if "$ref" in schema:
        return _instance(defs[schema["$ref"].rsplit("/", 1)[1]], defs, full=full)
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    for union in ("anyOf", "oneOf"):
        if union in schema:
            options = [o for o in schema[union] if o.get("type") != "null"] or schema[union]
            return _instance(options[0], defs, full=full)
    if "allOf" in schema:
        return _instance(schema["allOf"][0], defs, full=full)
    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        return _object(schema, defs, full=full)
    if kind == "array":
        items = schema.get("items", {})
        count = max(schema.get("minItems", 0), 2 if full else 0)
        return [_instance(items, defs, full=full) for _ in range(count)]
    return _scalar(schema, kind)


def _object(schema: dict[str, Any], defs: dict[str, Any], *, full: bool) -> dict[str, Any]:
    required = set(schema.get("required", ()))
    out = {
        name: _instance(sub, defs, full=full)
        for name, sub in schema.get("properties", {}).items()
        if full or name in required
    }
    extra = schema.get("additionalProperties")
    if full and isinstance(extra, dict) and not schema.get("properties"):
        out["key"] = _instance(extra, defs, full=full)
    return out


def _scalar(schema: dict[str, Any], kind: str | None) -> Any:
    if kind == "string":
        if schema.get("format") == "uuid":
            return str(uuid.UUID(int=7))
        if schema.get("contentEncoding") == "base64":
            return ""
        return "x" * max(schema.get("minLength", 0), 1)
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", 0))
        value = max(low, 0) + (1 if "exclusiveMinimum" in schema else 0) + 1
        if "maximum" in schema:
            value = min(value, schema["maximum"])
        return int(value) if kind == "integer" else float(value)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return "x"  # no type: anything goes
