"""`rollstream kafka up|down|status`: the local Kafka broker (or `--brokers 3` cluster)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.launcher import kafka
from rollstream.launcher.process import LauncherError

app = typer.Typer(help="The local Apache Kafka broker (KRaft) under <state_dir>/kafka.", no_args_is_help=True)

Brokers = Annotated[int, typer.Option("--brokers", "-b", help="1 (single node) or 3 (replication cluster)")]


@app.command()
def up(config: ConfigPath = None, overrides: Overrides = None, brokers: Brokers = 1) -> None:
    """Start the broker unless it runs; print the bootstrap address once it answers."""
    cfg = read_config(config, overrides)
    try:
        with console.status(f"starting Kafka ({brokers} node{'s' if brokers > 1 else ''})..."):
            bootstrap = kafka.ensure_up(cfg, brokers)
    except LauncherError as error:
        fail(str(error))
    if brokers > 1:
        hints = " ".join(f"-s '{o}'" for o in kafka.cluster_overrides(cfg, brokers))
        console.print(f"[dim]point commands at the cluster with: {hints}[/]")
    print(bootstrap)


@app.command()
def down(
    config: ConfigPath = None,
    overrides: Overrides = None,
    brokers: Brokers = 1,
    wipe: Annotated[bool, typer.Option(help="also delete the data (topics are lost)")] = False,
) -> None:
    """Stop the broker (SIGTERM, then SIGKILL after broker.stop_timeout_s)."""
    cfg = read_config(config, overrides)
    try:
        stopped = kafka.down(cfg, brokers, wipe=wipe)
    except LauncherError as error:
        fail(str(error))
    console.print(f"stopped {len(stopped)} Kafka node(s)" if stopped else "Kafka was not running")


@app.command()
def status(config: ConfigPath = None, overrides: Overrides = None, brokers: Brokers = 1) -> None:
    """Say whether each node runs and answers; exit 1 when any does not."""
    cfg = read_config(config, overrides)
    try:
        nodes = kafka.status(cfg, brokers)
    except LauncherError as error:
        fail(str(error))
    table = Table("node", "port", "pid", "answers", "dir")
    for node in nodes:
        table.add_row(str(node.node_id), str(node.port), str(node.pid or "-"), str(node.answers), node.dir)
    console.print(table)
    if not all(node.answers for node in nodes):
        raise typer.Exit(1)
