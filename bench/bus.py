"""`rollstream bench bus`: events/s through `streams.bus` vs raw aiokafka, same broker, same run.

Our path: `EventProducer.send` (encode + batch) and `EventConsumer.batch` (decode,
dead-letter check) of a realistic mix of events (`streams.eventgen.BENCH_MIX`:
turn.generated events with a few hundred tokens and logprobs, tool output, ...).
Raw path: one `AIOKafkaProducer` with the same settings sending the same
pre-encoded bytes and keys with `send` (futures not awaited one by one), and an
`AIOKafkaConsumer` reading them back with `getmany`. Each pass produces and
consumes concurrently into fresh topics (deleted afterwards); passes alternate
our/raw and the medians are reported (also this process's CPU µs per event, steadier
than wall time on a shared machine). Last line:
`{"events_per_s": ..., "raw_events_per_s": ..., "ratio": ...}`.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Annotated

import typer
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from rich.progress import Progress

from bench.figures import median_rates
from bench.local_broker import ensure_local_broker, fresh_topics
from rollstream.command_line import ConfigPath, Overrides, console, read_config
from rollstream.config import Config
from streams.bus import EventConsumer, EventProducer
from streams.eventgen import bench_mix
from streams.events import Event, encode_event
from streams.settings import TopicSettings
from streams.topics import delete_topics, topic_name

TOPIC = "rollout.events"
UNIQUE_EVENTS = 4096  # the mix repeats after this many (generation is not what we measure)


async def _ours(
    config: Config, topics: TopicSettings, events: list[Event], on_progress: Callable[[int], None]
) -> float:
    async with EventConsumer(config.kafka, topics, [TOPIC], group_id=None, name="bench") as consumer:
        start = time.perf_counter()

        async def produce() -> None:
            async with EventProducer(config.kafka, topics) as producer:
                for event in events:
                    await producer.send(TOPIC, event)

        producing = asyncio.create_task(produce())
        seen = 0
        while seen < len(events):
            seen += len(await consumer.batch(timeout_ms=200))
            on_progress(seen)
        await producing
        return time.perf_counter() - start


async def _raw(
    config: Config,
    topics: TopicSettings,
    records: list[tuple[bytes, bytes | None]],
    on_progress: Callable[[int], None],
) -> float:
    kafka = config.kafka
    name = topic_name(topics, TOPIC)
    consumer = AIOKafkaConsumer(
        name,
        bootstrap_servers=kafka.bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=kafka.fetch_max_bytes,
        max_partition_fetch_bytes=kafka.max_partition_fetch_bytes,
    )
    producer = AIOKafkaProducer(
        bootstrap_servers=kafka.bootstrap,
        acks="all",
        enable_idempotence=True,
        compression_type=None if kafka.compression == "none" else kafka.compression,
        linger_ms=kafka.linger_ms,
        max_batch_size=kafka.max_batch_size,
        max_request_size=kafka.max_request_size,
    )
    await consumer.start()
    await producer.start()
    try:
        start = time.perf_counter()

        async def produce() -> None:
            for value, key in records:
                await producer.send(name, value, key=key)
            await producer.flush()

        producing = asyncio.create_task(produce())
        seen = 0
        while seen < len(records):
            batches = await consumer.getmany(timeout_ms=200, max_records=5000)
            for batch in batches.values():
                seen += sum(1 for record in batch if record.value)
            on_progress(seen)
        await producing
        return time.perf_counter() - start
    finally:
        await producer.stop()
        await consumer.stop()


async def _run(config: Config, count: int, rounds: int, tokens: int) -> dict[str, float]:
    unique = bench_mix(min(count, UNIQUE_EVENTS), tokens)
    events = [unique[i % len(unique)] for i in range(count)]
    encoded = [encode_event(event) for event in unique]
    records = [(encoded[i % len(unique)], unique[i % len(unique)].key) for i in range(count)]
    ours: list[float] = []
    raw: list[float] = []
    cpu: dict[str, list[float]] = {"streams.bus": [], "raw aiokafka": []}  # this process, µs per event
    with Progress(console=console, transient=True) as progress:
        for round_no in range(1, rounds + 1):
            for label, results in (("streams.bus", ours), ("raw aiokafka", raw)):
                task = progress.add_task(f"round {round_no}/{rounds} {label}", total=count)

                def on_progress(seen: int, task: int = task) -> None:
                    progress.update(task, completed=seen)

                topics = await fresh_topics(config, "bench")
                try:
                    run: Awaitable[float] = (
                        _ours(config, topics, events, on_progress)
                        if results is ours
                        else _raw(config, topics, records, on_progress)
                    )
                    cpu_start = time.process_time()
                    results.append(count / await run)
                    cpu[label].append((time.process_time() - cpu_start) / count * 1e6)
                finally:
                    await delete_topics(config.kafka, topics)
                console.print(f"round {round_no} {label}: {results[-1]:,.0f} events/s")
    return {
        "events": count,
        "rounds": rounds,
        "cpu_us_per_event": round(statistics.median(cpu["streams.bus"]), 1),
        "raw_cpu_us_per_event": round(statistics.median(cpu["raw aiokafka"]), 1),
        **median_rates(ours, raw),
    }


def command(
    config: ConfigPath = None,
    overrides: Overrides = None,
    events: Annotated[int, typer.Option(help="events per pass")] = 200_000,
    rounds: Annotated[int, typer.Option(help="passes of each path (alternating); medians reported")] = 3,
    tokens: Annotated[int, typer.Option(help="output tokens per turn.generated")] = 300,
) -> None:
    """Events/s produced and consumed through streams.bus vs raw aiokafka (target ratio >= 0.7)."""
    cfg = read_config(config, overrides)
    ensure_local_broker(cfg)
    result = asyncio.run(_run(cfg, events, rounds, tokens))
    console.print(f"streams.bus {result['events_per_s']:,.0f}/s vs raw {result['raw_events_per_s']:,.0f}/s")
    print(json.dumps(result))
