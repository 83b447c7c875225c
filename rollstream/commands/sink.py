"""`rollstream sink`: Kafka's source-of-truth topics into the SQL event store, exactly once.

Runs `streams.sink.Sink` on the config's database (or `--db`), showing events
sunk and the rate; SIGINT/SIGTERM finish the batch in hand and exit. With
`--until-idle SECONDS` it exits once caught up and nothing new arrived for that long.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.config import Config
from streams.heartbeat import start_heartbeat
from streams.sink import Sink, SinkError, SinkProgress
from streams.store import StoreError, open_store


def command(
    db: Annotated[
        str | None, typer.Option("--db", help="database URL (default: the config's db_url)")
    ] = None,
    until_idle: Annotated[
        float | None,
        typer.Option("--until-idle", min=0, help="exit once caught up and nothing new arrived for SECONDS"),
    ] = None,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Consume the source-of-truth topics into SQL; each batch and its offsets in one transaction."""
    cfg = read_config(config, overrides)
    url = db or cfg.db_url
    try:
        engine = open_store(url, cfg.db.sqlite_cache_mib)
    except (StoreError, SQLAlchemyError) as error:
        fail(f"cannot open the event store {url}: {error}")
    try:
        totals = asyncio.run(_run(cfg, engine, until_idle))
    except SinkError as error:
        fail(str(error))
    finally:
        engine.dispose()
    console.print(
        f"sink: {totals.stored} events stored, {totals.duplicates} duplicates, "
        f"{totals.deadlettered} dead-lettered, {totals.records} records in {totals.elapsed_s:.1f}s"
    )


async def _run(cfg: Config, engine: Engine, until_idle: float | None) -> SinkProgress:
    start_heartbeat()  # beats from the sink's loop (supervisor)
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]sink[/] {task.fields[stored]:,} events stored"),
        TextColumn("{task.fields[rate]:,.0f} records/s"),
        TextColumn("{task.fields[dead]} dead-lettered"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("sink", total=None, stored=0, rate=0.0, dead=0)

        def show(totals: SinkProgress) -> None:
            progress.update(task, stored=totals.stored, rate=totals.rate, dead=totals.deadlettered)

        sink = Sink(cfg.kafka, cfg.topics, cfg.db, engine, progress=show)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, sink.stop)
        return await sink.run(until_idle_s=until_idle)
