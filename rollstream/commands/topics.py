"""`rollstream topics create|list`: every Rollstream topic with its partitions and configs."""

from __future__ import annotations

import asyncio
from typing import Annotated

import typer
from rich.table import Table

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from streams.topics import TopicError, create_topics, delete_topics, list_topics

app = typer.Typer(help="Rollstream topics on the configured Kafka cluster.", no_args_is_help=True)


@app.command()
def create(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Create every topic that does not exist yet (existing topics are left as they are)."""
    cfg = read_config(config, overrides)
    try:
        names = asyncio.run(create_topics(cfg.kafka, cfg.topics))
    except (TopicError, OSError) as error:
        fail(f"{error} (is Kafka up at {cfg.kafka.bootstrap}? `rollstream kafka up`)")
    except Exception as error:  # aiokafka connection errors have no common base
        fail(f"could not reach Kafka at {cfg.kafka.bootstrap}: {error!r}; start it: `rollstream kafka up`")
    console.print(f"{len(names)} topics ready on {cfg.kafka.bootstrap}: {', '.join(names)}")


@app.command(name="list")
def list_(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """The Rollstream topics under the configured prefix, with partitions and key configs."""
    cfg = read_config(config, overrides)
    try:
        topics = asyncio.run(list_topics(cfg.kafka, cfg.topics))
    except Exception as error:
        fail(f"could not list topics at {cfg.kafka.bootstrap}: {error!r}; is Kafka up? `rollstream kafka up`")
    if not topics:
        console.print(f"no Rollstream topics under prefix {cfg.topics.prefix!r}: `rollstream topics create`")
        return
    columns = [
        "partitions",
        "leaders",
        "replication",
        "min.insync.replicas",
        "cleanup.policy",
        "retention.ms",
        "max.message.bytes",
    ]
    table = Table("topic", *columns)
    for name, info in topics.items():
        table.add_row(name, *(info.get(column, "") for column in columns))
    console.print(table)


@app.command()
def delete(
    config: ConfigPath = None,
    overrides: Overrides = None,
    yes: Annotated[bool, typer.Option("--yes", help="delete even without a topics.prefix")] = False,
) -> None:
    """Delete the Rollstream topics under topics.prefix (their records are lost)."""
    cfg = read_config(config, overrides)
    if not cfg.topics.prefix and not yes:
        fail("topics.prefix is empty: this would delete the run's own topics; pass --yes to mean it")
    names = asyncio.run(delete_topics(cfg.kafka, cfg.topics))
    console.print(f"deleted {len(names)} topic(s)" + (f": {', '.join(names)}" if names else ""))
