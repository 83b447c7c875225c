"""Helpers of the sink tests: produce events, start `rollstream sink` as a real process, read offsets.

The sink runs as `python -c ...` on `rollstream.commands.sink.command` (the very
CLI command, without importing every other command module) so that SIGKILL hits
a real process.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from sqlalchemy import Engine, inspect, text

from rollstream.config import Config
from streams.bus import EventProducer
from streams.eventgen import short_topic
from streams.events import Event
from streams.sink import sink_partitions
from streams.store import StoreError, open_readonly

SINK_MAIN = "import typer; from rollstream.commands.sink import command; typer.run(command)"
REPO = Path(__file__).resolve().parents[2]


def produce(config: Config, events: list[Event], bad: Sequence[tuple[str, bytes]] = ()) -> None:
    """Send `events` to their topics and raw `bad` records (short topic, bytes); all acked."""

    async def send() -> None:
        async with EventProducer(config.kafka, config.topics) as producer:
            for event in events:
                await producer.send(short_topic(event), event)
            for short, value in bad:
                await producer.send_raw(short, value, b"bad-key")
            await producer.flush()

    asyncio.run(send())


def topic_ends(config: Config) -> dict[tuple[str, int], int]:
    """End offset of every partition of the sink topics, by (full topic name, partition)."""

    async def ends() -> dict[tuple[str, int], int]:
        tps = await sink_partitions(config.kafka, config.topics, config.db)
        consumer = AIOKafkaConsumer(bootstrap_servers=config.kafka.bootstrap, group_id=None)
        await consumer.start()
        try:
            found = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        return {(tp.topic, tp.partition): offset for tp, offset in found.items()}

    return asyncio.run(ends())


def config_args(config: Config) -> list[str]:
    return [
        "-s",
        f'kafka.bootstrap="{config.kafka.bootstrap}"',
        "-s",
        f'topics.prefix="{config.topics.prefix}"',
        "-s",
        f'run.state_dir="{config.run.state_dir}"',
        "-s",
        f"db.sink_batch_size={config.db.sink_batch_size}",
    ]


def start_sink(
    config: Config, url: str, log: Path, until_idle: float | None = None
) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-c", SINK_MAIN, "--db", url, *config_args(config)]
    if until_idle is not None:
        args += ["--until-idle", str(until_idle)]
    with log.open("ab") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


def run_sink_until_idle(config: Config, url: str, log: Path, timeout_s: float = 300.0) -> None:
    process = start_sink(config, url, log, until_idle=3.0)
    try:
        code = process.wait(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code == 0, f"sink exited with {code}:\n{log.read_text()[-3000:]}"


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.05)


def stored_offsets(engine: Engine) -> dict[tuple[str, int], int]:
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT topic, partition, next_offset FROM consumer_offsets"))
        return {(topic, partition): offset for topic, partition, offset in rows}


def offsets_match_rows(engine: Engine) -> int:
    """Check one snapshot, per partition: stored offset = last stored kafka_offset + 1 and rows
    0..last all there (no record is skipped by the sink's offsets). Returns the events stored."""
    snapshot = {"isolation_level": "REPEATABLE READ"} if engine.dialect.name == "postgresql" else {}
    with engine.connect().execution_options(**snapshot) as conn:  # SQLite: a read transaction is a snapshot
        offsets = {
            (t, p): o
            for t, p, o in conn.execute(text("SELECT topic, partition, next_offset FROM consumer_offsets"))
        }
        extents = {
            (t, p): (top, count)
            for t, p, top, count in conn.execute(
                text(
                    "SELECT kafka_topic, kafka_partition, MAX(kafka_offset), COUNT(*) FROM events "
                    "GROUP BY kafka_topic, kafka_partition"
                )
            )
        }
    assert set(offsets) == set(extents), f"offsets {sorted(offsets)} but rows in {sorted(extents)}"
    for where, (top, count) in extents.items():
        assert offsets[where] == top + 1, f"{where}: offset {offsets[where]} but last row at {top}"
        assert count == top + 1, f"{where}: {count} rows for offsets 0..{top}"
    return sum(count for _top, count in extents.values())


def checked_count(url: str) -> int:
    """Events stored so far, after checking that snapshot's offsets (0 before the sink migrated)."""
    try:
        engine = open_readonly(url)
    except StoreError:
        return 0  # the sink has not created the SQLite file yet
    try:
        if "consumer_offsets" not in inspect(engine).get_table_names():
            return 0
        return offsets_match_rows(engine)
    finally:
        engine.dispose()
