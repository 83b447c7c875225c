"""`rollstream bench streams`: the stream worker against raw consumption of the same topic.

One run, fresh topics under a unique prefix (deleted afterwards):

1. writes `--trajectories` synthetic episodes (groups of `--group-size`, rollout
   events shaped as the rollout worker writes them: `streams.eventgen`) to
   `rollout.events`;
2. baseline: a plain `EventConsumer` reads and decodes every record of the topic
   (`raw_events_per_s`: run before and again after ours, the faster of the two,
   as the machine is shared and noisy);
3. ours: a `StreamWorker` (consumer group, fold, policies, groups, producing
   `trajectories` and `groups`, committing) processes the same backlog
   (`events_per_s`: events from its first record to its last group);
4. latency: with the worker still running, new groups are written live at
   `--live-groups-per-s`; `group_latency_p99_s` is the p99 of the time from a
   group's last `trajectory.finished` being sent to its group record being read
   back from `groups` (so it includes both Kafka hops).

Last line: `{"events_per_s", "raw_events_per_s", "ratio", "group_latency_p99_s"}`.
Targets: ratio >= 0.5, p99 <= 0.5 s.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import Progress

from bench.figures import percentile
from rollstream.command_line import ConfigPath, Overrides, read_config
from rollstream.config import Config
from streams.app import StreamWorker
from streams.bus import EventConsumer, EventProducer
from streams.eventgen import group_events, random_attempts
from streams.events import Event, encode_event
from streams.settings import PolicySettings
from streams.topics import create_topics, delete_topics

console = Console(stderr=True)
RUN = "bench-streams"


def _groups(count: int, group_size: int, seed: int, t0_ns: int, prefix: str) -> list[list[Event]]:
    """`count` groups' events (each group in time order); 4-turn cap keeps events small and many."""
    rng = random.Random(seed)
    return [
        group_events(RUN, f"{prefix}g{i:06d}", random_attempts(rng, group_size, max_turns=4), t0_ns=t0_ns)
        for i in range(count)
    ]


async def _write(config: Config, values: list[tuple[bytes, bytes]], progress: Progress) -> None:
    task = progress.add_task("writing rollout.events", total=len(values))
    async with EventProducer(config.kafka, config.topics) as producer:
        for index, (key, value) in enumerate(values):
            await producer.send_raw("rollout.events", value, key)
            if index % 5000 == 0:
                progress.update(task, completed=index)
        await producer.flush()
    progress.update(task, completed=len(values))


async def _raw(config: Config, total: int, progress: Progress) -> float:
    """Events per second of a plain consumer decoding the whole topic."""
    task = progress.add_task("baseline: raw consume + decode", total=total)
    seen, first = 0, None
    async with EventConsumer(
        config.kafka, config.topics, ["rollout.events"], group_id=None, name="bench-raw"
    ) as raw:
        while seen < total:
            batch = await raw.batch(timeout_ms=500, max_records=config.streams.batch_max_records)
            if batch and first is None:
                first = time.perf_counter()
            seen += len(batch)
            progress.update(task, completed=seen)
    return total / (time.perf_counter() - (first or time.perf_counter()))


async def _worker_throughput(
    worker: StreamWorker, stop: asyncio.Event, total: int, groups: int, progress: Progress
) -> tuple[asyncio.Task[object], float]:
    task = progress.add_task("ours: stream worker fold + groups", total=groups)
    runner = asyncio.create_task(worker.run(stop))
    first = None
    while worker.stats.groups < groups:
        if runner.done():
            runner.result()
            raise RuntimeError("the stream worker stopped early")
        if first is None and worker.stats.events:
            first = time.perf_counter()
        progress.update(task, completed=worker.stats.groups)
        await asyncio.sleep(0.02)
    progress.update(task, completed=groups)
    return runner, worker.stats.events / (time.perf_counter() - (first or time.perf_counter()))


async def _latency(
    config: Config, worker: StreamWorker, groups: int, rate: float, progress: Progress
) -> list[float]:
    """Seconds from each live group's last finished event being sent to its record read back."""
    task = progress.add_task("latency: live groups", total=groups)
    sent: dict[str, float] = {}
    latencies: list[float] = []
    async with (
        EventConsumer(config.kafka, config.topics, ["groups"], group_id=None, name="bench-groups") as reader,
        EventProducer(config.kafka, config.topics) as producer,
    ):
        await reader.batch(timeout_ms=1000)  # joined and positioned before the clock starts
        live = _groups(groups, 8, seed=99, t0_ns=time.time_ns(), prefix="live-")

        async def send_all() -> None:
            for events in live:
                for event in events:
                    await producer.send("rollout.events", event)
                await producer.flush()
                sent[events[0].group_id or ""] = time.perf_counter()
                await asyncio.sleep(1 / rate)

        sender = asyncio.create_task(send_all())
        deadline = time.monotonic() + groups / rate + 60
        while len(latencies) < groups and time.monotonic() < deadline:
            for record in await reader.batch(timeout_ms=200):
                started = sent.get(record.event.group_id or "")
                if started is not None:
                    latencies.append(time.perf_counter() - started)
            progress.update(task, completed=len(latencies))
        await sender
    return latencies


async def _bench(config: Config, trajectories: int, group_size: int, live_groups: int, rate: float) -> dict:
    await create_topics(config.kafka, config.topics)
    try:
        with Progress(console=console) as progress:
            groups = _groups(trajectories // group_size, group_size, seed=1, t0_ns=time.time_ns(), prefix="")
            values = [(e.key or b"", encode_event(e)) for events in groups for e in events]
            await _write(config, values, progress)
            raw_before = await _raw(config, len(values), progress)
            policy = PolicySettings(group_size=group_size, max_staleness=-1)
            worker = StreamWorker(config.kafka, config.topics, policy, config.streams, name="bench-worker")
            stop = asyncio.Event()
            runner, rate_ours = await _worker_throughput(worker, stop, len(values), len(groups), progress)
            latencies = await _latency(config, worker, live_groups, rate, progress)
            stop.set()
            await runner
            raw_after = await _raw(config, len(values), progress)  # the machine is shared: take the faster
    finally:
        await delete_topics(config.kafka, config.topics)
    raw_rate = max(raw_before, raw_after)
    p99 = percentile(latencies, 0.99) if latencies else float("nan")
    p50 = percentile(latencies, 0.5) if latencies else float("nan")
    console.print(
        f"{len(values)} events in {len(groups)} groups; worker {rate_ours:,.0f} ev/s, "
        f"raw {raw_rate:,.0f} ev/s; {len(latencies)}/{live_groups} live groups, latency p50 {p50:.3f}s"
    )
    return {
        "events_per_s": round(rate_ours, 1),
        "raw_events_per_s": round(raw_rate, 1),
        "ratio": round(rate_ours / raw_rate, 3),
        "raw_runs_events_per_s": [round(raw_before, 1), round(raw_after, 1)],
        "group_latency_p99_s": round(p99, 4),
        "events": len(values),
        "trajectories": len(groups) * group_size,
    }


def command(
    trajectories: int = typer.Option(20000, "--trajectories", help="episodes in the backlog"),
    group_size: int = typer.Option(8, "--group-size"),
    live_groups: int = typer.Option(200, "--live-groups", help="groups written live for the latency figure"),
    live_rate: float = typer.Option(40.0, "--live-groups-per-s"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Stream worker throughput vs raw consumption, and finished-to-group latency."""
    base = read_config(config, overrides)
    prefix = f"bench-streams-{uuid.uuid4().hex[:8]}-"
    cfg = base.with_overrides([f'topics.prefix="{prefix}"', f'streams.group_id="{prefix}worker"'])
    Path(cfg.run.state_dir).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(_bench(cfg, trajectories, group_size, live_groups, live_rate))
    print(json.dumps(result))
