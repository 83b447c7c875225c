"""`rollstream worker`: one stream worker (start any number; partitions spread the work)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

import typer
from rich.live import Live
from rich.table import Table

from rollstream.command_line import ConfigPath, Overrides, console, read_config
from streams.app import StreamWorker, WorkerStats
from streams.heartbeat import start_heartbeat


def command(
    config: ConfigPath = None,
    overrides: Overrides = None,
    name: str = typer.Option("", "--name", help="worker name (default: host-pid)"),
) -> None:
    """Fold rollout events into trajectories and GRPO groups until interrupted (SIGINT/SIGTERM)."""
    cfg = read_config(config, overrides)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("streams.app").setLevel(logging.INFO)  # partition assignments
    worker = StreamWorker(
        cfg.kafka,
        cfg.topics,
        cfg.policy,
        cfg.streams,
        name=name or f"streams-{socket.gethostname()}-{os.getpid()}",
    )
    console.print(
        f"stream worker [bold]{worker.name}[/] on {cfg.kafka.bootstrap}, topics prefix {cfg.topics.prefix!r}"
    )
    stats = asyncio.run(_serve(worker))
    console.print(_table(stats))


async def _serve(worker: StreamWorker) -> WorkerStats:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    start_heartbeat()  # beats from this loop, so a blocked worker stops beating (supervisor)
    task = asyncio.create_task(worker.run(stop))
    with Live(_table(worker.stats), console=console, refresh_per_second=1, transient=True) as live:
        while not task.done():
            await asyncio.wait({task}, timeout=1.0)
            live.update(_table(worker.stats))
    return await task


def _table(stats: WorkerStats) -> Table:
    table = Table(title="stream worker")
    for column in (
        "events",
        "trajectories",
        "groups",
        "aborts",
        "dead letters",
        "open groups",
        "skipped on start",
    ):
        table.add_column(column, justify="right")
    table.add_row(
        *(
            str(v)
            for v in (
                stats.events,
                stats.trajectories,
                stats.groups,
                stats.aborts,
                stats.dead_letters,
                stats.open_groups,
                stats.skipped_on_start,
            )
        )
    )
    return table
