"""`rollstream config show`: the effective config as TOML (or JSON)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from rollstream.command_line import ConfigPath, Overrides, console, read_config

app = typer.Typer(help="Inspect the effective configuration.", no_args_is_help=True)


@app.command("show")
def show(
    config: ConfigPath = None,
    overrides: Overrides = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON instead of TOML")] = False,
) -> None:
    """Print every setting with its effective value (defaults, file, then --set)."""
    effective = read_config(config, overrides).model_dump(mode="json")
    if as_json:
        console.print_json(json.dumps(effective))
    else:
        print(to_toml(effective))


def to_toml(tree: dict[str, Any], prefix: str = "") -> str:
    """Render nested dicts as TOML tables (scalars first, then sub-tables)."""
    scalars = [f"{k} = {_value(v)}" for k, v in tree.items() if not isinstance(v, dict)]
    tables = [(k, v) for k, v in tree.items() if isinstance(v, dict)]
    out = []
    if scalars:
        out.append((f"[{prefix}]\n" if prefix else "") + "\n".join(scalars))
    for key, sub in tables:
        out.append(to_toml(sub, f"{prefix}.{key}" if prefix else key))
    return "\n\n".join(part for part in out if part)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if value is None:
        return '""'
    return repr(value)
