"""`rollstream bench NAME`: benchmarks that run our path and its baseline side by side.

Each benchmark is `bench/<module>.py` exposing `command`, a typer function that
prints progress and, as its last line, one JSON object with the figures and `ratio`.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(help="Benchmarks: our path and its baseline in one run; last line is JSON.")

BENCHMARKS = (
    ("bus", "bus"),
    ("sink", "sink"),
    ("sandbox", "sandbox"),
    ("engine", "engine"),
    ("gateway", "gateway"),
    ("rollout_sim", "rollout-sim"),
    ("streams", "streams"),
    ("tail", "tail"),
    ("trainer", "trainer"),
    ("learning", "learning"),
    ("monitor", "monitor"),
    ("chaos", "chaos"),
)

for _module_name, _cli_name in BENCHMARKS:
    app.command(name=_cli_name)(importlib.import_module(f"bench.{_module_name}").command)
