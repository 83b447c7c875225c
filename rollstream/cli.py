"""The `rollstream` command: one typer app composed of one sub-app per area.

Each area lives in `rollstream/commands/<area>.py` and exposes `app` (a typer
sub-app) or `command` (a single command). Commands read the one config through
`rollstream.command_line` (`ConfigPath`, `Overrides`, `read_config`); they import library
modules, never each other.

Sub-apps from outside the product register through the entry-point group
`rollstream.commands` (pyproject.toml): the benchmarks' `rollstream bench` (bench/cli.py), so that
nothing here imports `bench/`.
"""

from __future__ import annotations

import importlib
import sys
from importlib.metadata import entry_points

import typer

app = typer.Typer(
    name="rollstream",
    help="Asynchronous RL for software-engineering agents, event-sourced on Apache Kafka.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def main() -> None:
    """Asynchronous RL for software-engineering agents, event-sourced on Apache Kafka."""


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
    ("gateway", "gateway"),
    ("weights", "weights"),
    ("rollout", "rollout"),
)
# Sub-apps found through entry points, registered after ours (`bench`: bench/cli.py).
PLUGIN_GROUP = "rollstream.commands"
SINGLE_COMMANDS = (
    ("sink", "sink"),
    ("sql", "sql"),
    ("worker", "worker"),
    ("train", "train"),
    ("replay", "replay"),
    ("whatif", "whatif"),
    ("tail", "tail"),
    ("report", "report"),
    ("demo", "demo"),
    ("up", "up"),
    ("monitor", "monitor"),
    ("evaluate", "eval"),
)

OWN_NAMES = frozenset(name for _, name in (*SUB_APPS, *SINGLE_COMMANDS))


def _requested(argv: list[str]) -> set[str] | None:
    """The command named on the command line, when it is one of ours; None = all of them.

    Registering only that command keeps `rollstream sql ...` from importing torch and the
    rest (seconds per process on a small machine); help and unknown names see everything.
    The entry points are read only for a name that is not ours (reading them costs ~50 ms).
    """
    words = [a for a in argv[1:] if not a.startswith("-")]
    if not words:
        return None
    if words[0] in OWN_NAMES or words[0] in {point.name for point in entry_points(group=PLUGIN_GROUP)}:
        return {words[0]}
    return None


def _register(only: set[str] | None) -> None:
    for module_name, cli_name in SUB_APPS:
        if only is None or cli_name in only:
            module = importlib.import_module(f"rollstream.commands.{module_name}")
            app.add_typer(module.app, name=cli_name)
    if only is None or not only <= OWN_NAMES:
        for point in sorted(entry_points(group=PLUGIN_GROUP), key=lambda p: p.name):
            if only is None or point.name in only:
                app.add_typer(point.load(), name=point.name)
    for module_name, cli_name in SINGLE_COMMANDS:
        if only is None or cli_name in only:
            module = importlib.import_module(f"rollstream.commands.{module_name}")
            app.command(name=cli_name)(module.command)


_register(_requested(sys.argv))
