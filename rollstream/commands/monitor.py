"""`rollstream monitor`: the faust monitor over the derived topics, serving `/metrics`.

Prints the metrics address, then runs until SIGTERM/SIGINT and exits 0. `--port`
overrides `monitor.port` (0 = a free port, picked here and printed).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated

import typer
from aiokafka.errors import KafkaError

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.config import Config
from rollstream.launcher.process import free_port


def monitor_dir(cfg: Config) -> Path:
    return Path(cfg.monitor.state_dir) if cfg.monitor.state_dir else cfg.state_dir / "monitor"


def _missing_topics(cfg: Config) -> list[str]:
    from streams.monitor.app import SOURCES
    from streams.topics import list_topics, topic_name

    try:
        present = asyncio.run(list_topics(cfg.kafka, cfg.topics))
    except KafkaError as error:
        fail(f"cannot reach Kafka at {cfg.kafka.bootstrap}: {error}")
    return [name for name in (topic_name(cfg.topics, s) for s in SOURCES) if name not in present]


def command(
    port: Annotated[
        int | None, typer.Option("--port", "-p", min=0, max=65535, help="port of /metrics (0 = any free)")
    ] = None,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Windowed figures of the run from the derived topics, as Prometheus metrics on /metrics."""
    from faust import Worker

    from streams.monitor.app import Monitor
    from streams.topics import ensure_topics

    cfg = read_config(config, overrides)
    missing = _missing_topics(cfg)
    if missing:
        where = cfg.kafka.bootstrap
        fail(f"topics {', '.join(missing)} do not exist at {where}: run `rollstream topics create`")
    settings = cfg.monitor
    chosen = settings.port if port is None else port
    settings = settings.model_copy(update={"port": chosen or free_port(settings.host)})
    data_dir = monitor_dir(cfg)
    data_dir.mkdir(parents=True, exist_ok=True)
    monitor = Monitor(cfg.kafka, cfg.topics, settings, data_dir)
    asyncio.run(ensure_topics(cfg.kafka, monitor.changelog_specs(), cfg.topics.create_timeout_s))
    console.print(f"monitor: http://{settings.host}:{settings.port}/metrics", highlight=False)
    logging.getLogger("faust").setLevel(logging.WARNING)
    worker = Worker(monitor.app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as done:
        raise typer.Exit(int(done.code or 0)) from None
