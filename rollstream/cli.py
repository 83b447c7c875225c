"""The `rollstream` command: one typer app composed of one sub-app per area.

Each area lives in `rollstream/commands/<area>.py` and exposes `app` (a typer
sub-app) or `command` (a single command). Commands read the one config through
`rollstream.commands.common.config_option`.
"""

from __future__ import annotations

import importlib
import importlib.util

import typer

app = typer.Typer(
    name="rollstream",
    help="Asynchronous RL for software-engineering agents, event-sourced on Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

# (module under rollstream.commands, CLI name). Sub-apps first, single commands after.
SUB_APPS = (
    ("config", "config"),
    ("kafka", "kafka"),
    ("postgres", "postgres"),
    ("topics", "topics"),
    ("schemas", "schemas"),
    ("db", "db"),
    ("tasks", "tasks"),
    ("sandbox", "sandbox"),
    ("model", "model"),
    ("engine", "engine"),
    ("rollout", "rollout"),
    ("bench", "bench"),
)
SINGLE_COMMANDS = (
    ("sink", "sink"),
    ("sql", "sql"),
    ("worker", "worker"),
    ("replay", "replay"),
    ("whatif", "whatif"),
    ("tail", "tail"),
    ("demo", "demo"),
)


def _register() -> None:
    for module_name, cli_name in SUB_APPS:
        if importlib.util.find_spec(f"rollstream.commands.{module_name}") is None:
            continue  # TODO(integration): strict once every area has landed
        module = importlib.import_module(f"rollstream.commands.{module_name}")
        app.add_typer(module.app, name=cli_name)
    for module_name, cli_name in SINGLE_COMMANDS:
        if importlib.util.find_spec(f"rollstream.commands.{module_name}") is None:
            continue
        module = importlib.import_module(f"rollstream.commands.{module_name}")
        app.command(name=cli_name)(module.command)


_register()
