"""`rollstream bench NAME`: benchmarks that run our path and its baseline side by side.

Each benchmark is `bench/<module>.py` exposing `command`, a typer function that prints progress
and, as its last line, one JSON object with the figures and `ratio`.

This app reaches the `rollstream` command through a Python entry point (group
`rollstream.commands`, name `bench`, in pyproject.toml) that `rollstream.cli` discovers at run
time, rather than through an import of `bench` from the product: `bench/` is a leaf that imports
the product and is imported by nothing in it, yet `rollstream bench NAME`, its options, its
`--help` and the generated CLI reference stay exactly what they were (running `python -m bench`
in a child process instead would have lost the one Typer tree the reference is generated from).
The entry point is written by `scripts/setup_python.sh` (`pip install -e .`).
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(help="Benchmarks: our path and its baseline in one run; last line is JSON.")

# (module under bench, CLI name), in the order `rollstream bench --help` lists them.
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
