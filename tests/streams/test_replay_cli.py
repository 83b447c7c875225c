"""`rollstream replay/whatif/tail` on a run the real stream worker processed (topics and SQL store)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import typer
from sqlalchemy import text
from typer.testing import CliRunner

from rollstream.commands import replay, tail, whatif
from rollstream.config import Config
from streams import bus
from streams.app import StreamWorker
from streams.eventgen import synthetic_run, weights_event
from streams.events import Event, encode_event, make_event
from streams.payloads import GroupFormed
from streams.settings import PolicySettings
from streams.store import open_store

RUN = "run-replay"
app = typer.Typer()  # only this area's commands: the test does not depend on every other command importing
for _name, _module in (("replay", replay), ("whatif", whatif), ("tail", tail)):
    app.command(name=_name)(_module.command)
GROUPS = 8


async def _process(config: Config, events: list[Event], weights: list[Event]) -> None:
    """Write the run's events and weights, and let one stream worker fold them all."""
    async with bus.EventProducer(config.kafka, config.topics) as producer:
        for event in weights:
            # `weights` is compacted: its records need a key (the run)
            await producer.send_raw("weights", encode_event(event), event.run_id.encode())
            await producer.send("weights.history", event)
        for event in events:
            await producer.send("rollout.events", event)
    policy = PolicySettings(group_size=4, max_staleness=1)
    worker = StreamWorker(config.kafka, config.topics, policy, config.streams, name="w-replay")
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + 120
    while worker.stats.groups < GROUPS:
        assert time.monotonic() < deadline and not task.done(), f"worker stalled: {worker.stats}"
        await asyncio.sleep(0.3)
    stop.set()
    await task


def _store(url: str, events: list[Event]) -> None:
    """Rows of the store's `events` table, as the sink writes them (plain SQL: no coupling to its code)."""
    engine = open_store(url)
    columns = [*Event.ENVELOPE_FIELDS, "data", "kafka_topic", "kafka_partition", "kafka_offset"]
    insert = text(f"INSERT INTO events ({', '.join(columns)}) VALUES ({', '.join(':' + c for c in columns)})")
    rows = []
    for offset, event in enumerate(events):
        wire = json.loads(encode_event(event))
        row = {
            k: (str(wire[k]) if k in ("id", "causation_id") and wire[k] else wire[k])
            for k in Event.ENVELOPE_FIELDS
        }
        rows.append(
            {
                **row,
                "data": json.dumps(wire["data"]),
                "kafka_topic": "t",
                "kafka_partition": 0,
                "kafka_offset": offset,
            }
        )
    with engine.begin() as conn:
        conn.execute(insert, rows)
    engine.dispose()


def test_replay_compare_datasets_whatif_and_tail(
    config_factory: Callable[..., Config], tmp_path: Path, sqlite_url: str
) -> None:
    config = config_factory()
    events = synthetic_run(RUN, groups=GROUPS, group_size=4, seed=4, max_turns=10)
    t0 = min(e.time_ns for e in events)
    weights = [weights_event(RUN, v, t0 + v * 3_000_000_000) for v in range(4)]
    asyncio.run(_process(config, events, weights))
    groups = asyncio.run(bus.read_topic(config.kafka, config.topics, "groups", idle_s=0.5))
    assert {c.event.data.dropped for c in groups} >= {"stale"}  # type: ignore[attr-defined]
    common = [
        "-s",
        f'kafka.bootstrap="{config.kafka.bootstrap}"',
        "-s",
        f'topics.prefix="{config.topics.prefix}"',
        "-s",
        f'db.url="{sqlite_url}"',
    ]
    runner = CliRunner()

    result = runner.invoke(app, ["replay", "--run", RUN, "--compare", *common])
    assert result.exit_code == 0, result.output
    assert "no differences" in result.output

    _store(sqlite_url, events + weights + [c.event for c in groups])
    result = runner.invoke(app, ["replay", "--run", RUN, "--compare", "--from-db", *common])
    assert result.exit_code == 0, result.output

    out = tmp_path / "sft.parquet"
    result = runner.invoke(
        app, ["replay", "--run", RUN, "--dataset", "sft", "--out", str(out), "--from-db", *common]
    )
    assert result.exit_code == 0 and out.stat().st_size > 0, result.output

    result = runner.invoke(app, ["whatif", "--run", RUN, *common, "-s", "policy.max_turns=3"])
    assert result.exit_code == 0, result.output
    assert "trajectories changed" in result.output and "max_turns: 10 -> 3" in result.output

    result = runner.invoke(app, ["tail", "--run", RUN, *common])
    assert result.exit_code == 0 and "wall time after 90% finished" in result.output, result.output

    first = groups[0].event
    forged = make_event(
        GroupFormed(members=[], rewards=[], advantages=[], policy=first.data.policy),  # type: ignore[attr-defined]
        run_id=RUN,
        seq=0,
        time_ns=first.time_ns,
        source="forger",
        group_id=f"{RUN}/forged",
        id_key="forged",
    )
    asyncio.run(_send(config, forged))
    result = runner.invoke(app, ["replay", "--run", RUN, "--compare", *common])
    assert result.exit_code == 1 and "recorded but not replayed" in result.output, result.output


async def _send(config: Config, event: Event) -> None:
    async with bus.EventProducer(config.kafka, config.topics) as producer:
        await producer.send_and_wait("groups", event)
