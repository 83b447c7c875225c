"""`rollstream bench monitor`: the faust monitor against a plain aiokafka consumer, and its lag.

One run, fresh topics under a unique prefix (all deleted afterwards, faust's
changelogs included). The records are what a run writes to the derived topics:
the real `StreamProcessor` and `LifecycleBuffer` fold generated episodes
(`streams.eventgen`) into `trajectories`, `groups` and `sandbox.lifecycle` records,
with a `trainer.step` and a `weights.published` every `--groups-per-step` groups.

1. Throughput. Every record is produced first. raw: a plain `AIOKafkaConsumer`
   reads them all from the start and `json.loads` each value (the monitor's decode,
   without figures or tables). ours: `rollstream monitor` starts as a process on
   the same topics; its `/metrics` is polled every `--poll-s` and the rate is the
   records folded (`rollstream_monitor_records_total`) between the first poll that
   saw any and the one that saw all, over that time (faust's start-up left out).
2. Lag. With the monitor caught up, trajectories arrive at `--per-hour` (default
   34,800: 10x the reference run's 3,480/hour), each with its sandbox records and its
   group's record when the group completes, for `--seconds`. A trajectory's lag is
   the time from just before it was produced to the first poll of `/metrics` whose
   `rollstream_trajectories_total` includes it (so it includes up to `--poll-s`).
Last line: `{"events_per_s", "raw_events_per_s", "ratio", "lag_p99_s"}`.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import replace

import typer
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from rich.console import Console

from bench.figures import percentile
from rollstream.command_line import ConfigPath, Overrides, read_config
from rollstream.config import Config
from streams.bus import EventProducer
from streams.eventgen import group_events, random_attempts
from streams.events import make_event
from streams.lifecycle import LifecycleBuffer
from streams.monitor.app import SOURCES
from streams.monitor.exposition import summary
from streams.payloads import TrainerStep, WeightsPublished
from streams.processor import Emit, StreamProcessor
from streams.topics import create_topics, topic_name

console = Console(stderr=True)
MONITOR = "import typer; from rollstream.commands.monitor import command; typer.run(command)"
Batch = list[tuple[str, list[Emit]]]  # per trajectory (or control record): its topic records, in order


def derived_records(cfg: Config, trajectories: int, group_size: int, tokens: int, per_step: int) -> Batch:
    """What the stream worker and trainer write for `trajectories` episodes, grouped per trajectory."""
    rng = random.Random(13)
    processor, buffer = StreamProcessor(cfg.policy), LifecycleBuffer()
    out: Batch = []
    groups = 0
    for g in range(max(1, trajectories // group_size)):
        specs = [
            replace(s, output_tokens=tokens, observation_tokens=tokens)
            for s in random_attempts(rng, group_size, max_turns=8)
        ]
        for event in group_events("bench-run", f"bench-run/g{g:06d}", specs, t0_ns=time.time_ns()):
            buffer.observe(event, processor.groups)
            emits = [o for o in buffer.release(processor.feed(event)) if isinstance(o, Emit)]
            if emits:
                out.append(("trajectory", emits))
            groups += sum(1 for e in emits if e.topic == "groups")
            if emits and groups and groups % per_step == 0 and any(e.topic == "groups" for e in emits):
                out.append(("step", _step_records(groups // per_step)))
    return out


def _step_records(step: int) -> list[Emit]:
    now = time.time_ns()
    data = TrainerStep(step=step, version=step, groups=1, trajectories=8, loss=0.1, grad_norm=0.07)
    weights = WeightsPublished(version=step, path=f"/w/{step}", step=step)
    return [
        Emit("trainer.steps", make_event(data, run_id="bench-run", seq=step, time_ns=now, source="trainer")),
        Emit("weights.history", make_event(weights, run_id="bench-run", seq=step, time_ns=now, source="w")),
    ]


async def produce(cfg: Config, batch: Batch) -> int:
    async with EventProducer(cfg.kafka, cfg.topics) as producer:
        for _, emits in batch:
            for emit in emits:
                await producer.send(emit.topic, emit.event)
        await producer.flush()
    return sum(len(emits) for _, emits in batch)


async def raw_rate(cfg: Config, total: int) -> float:
    """Records per second of a plain consumer (with `json.loads`) over every derived record."""
    consumer = AIOKafkaConsumer(
        *(topic_name(cfg.topics, s) for s in SOURCES),
        bootstrap_servers=cfg.kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
        fetch_max_bytes=cfg.kafka.fetch_max_bytes,
        max_partition_fetch_bytes=cfg.kafka.max_partition_fetch_bytes,
    )
    await consumer.start()
    seen, first = 0, 0.0
    try:
        while seen < total:
            for records in (await consumer.getmany(timeout_ms=1000, max_records=5000)).values():
                first = first or time.monotonic()
                for record in records:
                    json.loads(record.value)
                seen += len(records)
    finally:
        await consumer.stop()
    return seen / (time.monotonic() - first)


def scrape(url: str) -> dict[str, float]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return summary(response.read().decode())
    except OSError:
        return {}


def folded(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("rollstream_monitor_records_total"))


def trajectories_seen(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if k.startswith("rollstream_trajectories_total"))


def monitor_rate(url: str, total: int, poll_s: float, timeout_s: float) -> float:
    deadline = time.monotonic() + timeout_s
    first: tuple[float, float] | None = None
    while time.monotonic() < deadline:
        count, now = folded(scrape(url)), time.monotonic()
        if count and first is None:
            first = (now, count)
        if count >= total and first is not None and now > first[0]:
            return (count - first[1]) / (now - first[0])
        time.sleep(poll_s)
    raise RuntimeError(f"the monitor did not fold {total} records within {timeout_s:.0f}s")


async def lag_run(cfg: Config, url: str, batch: Batch, per_hour: float, poll_s: float) -> list[float]:
    """Produce `batch` at `per_hour` trajectories; the lag of each trajectory as /metrics shows it."""
    base = trajectories_seen(scrape(url))
    sent: list[float] = []
    lags: list[float] = []

    async def watch(done: asyncio.Event) -> None:
        while not done.is_set() or len(lags) < len(sent):
            seen = int(trajectories_seen(await asyncio.to_thread(scrape, url)) - base)
            now = time.monotonic()
            lags.extend(now - sent[k] for k in range(len(lags), min(seen, len(sent))))
            await asyncio.sleep(poll_s)

    done = asyncio.Event()
    watcher = asyncio.create_task(watch(done))
    start = time.monotonic()
    async with EventProducer(cfg.kafka, cfg.topics) as producer:
        for kind, emits in batch:
            if kind == "trajectory" and any(e.topic == "trajectories" for e in emits):
                await asyncio.sleep(max(0.0, start + len(sent) * 3600 / per_hour - time.monotonic()))
                sent.append(time.monotonic())
            for emit in emits:
                await producer.send(emit.topic, emit.event)
            await producer.flush()
    done.set()
    await asyncio.wait_for(watcher, timeout=120)
    return lags


async def delete_prefixed(cfg: Config) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=cfg.kafka.bootstrap)
    await admin.start()
    try:
        names = [n for n in await admin.list_topics() if n.startswith(cfg.topics.prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


def command(
    trajectories: int = typer.Option(4000, "--trajectories", help="records for the throughput run"),
    group_size: int = typer.Option(8, "--group-size"),
    tokens: int = typer.Option(64, "--tokens", help="output and observation tokens per turn"),
    groups_per_step: int = typer.Option(8, "--groups-per-step"),
    per_hour: float = typer.Option(34_800, "--per-hour", help="trajectories per hour in the lag run"),
    seconds: float = typer.Option(30.0, "--seconds", help="length of the lag run"),
    poll_s: float = typer.Option(0.1, "--poll-s", help="how often /metrics is read"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Monitor records/s vs a plain aiokafka consumer of the same records; lag p99 at 10x the reference."""
    prefix = f"bench-monitor-{uuid.uuid4().hex[:8]}-"
    cfg = read_config(config, overrides).with_overrides([f'topics.prefix="{prefix}"'])
    from rollstream.commands.monitor import free_port

    port = free_port(cfg.monitor.host)
    url = f"http://{cfg.monitor.host}:{port}/metrics"
    asyncio.run(create_topics(cfg.kafka, cfg.topics))
    monitor: subprocess.Popen[bytes] | None = None
    try:
        batch = derived_records(cfg, trajectories, group_size, tokens, groups_per_step)
        total = asyncio.run(produce(cfg, batch))
        raw = asyncio.run(raw_rate(cfg, total))
        console.print(f"raw consumer: {total} records at {raw:,.0f}/s")
        settings = [
            f'topics.prefix="{prefix}"',
            f'kafka.bootstrap="{cfg.kafka.bootstrap}"',
            f'run.state_dir="{cfg.state_dir}"',
        ]
        args = [sys.executable, "-c", MONITOR, "--port", str(port), *(a for s in settings for a in ("-s", s))]
        monitor = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ours = monitor_rate(url, total, poll_s, timeout_s=600)
        console.print(f"monitor: {total} records at {ours:,.0f}/s")
        live = derived_records(
            cfg, max(group_size, int(per_hour * seconds / 3600)), group_size, tokens, groups_per_step
        )
        lags = asyncio.run(lag_run(cfg, url, live, per_hour, poll_s))
        console.print(
            f"lag at {per_hour:,.0f} trajectories/h over {len(lags)} trajectories: "
            f"p50 {percentile(lags, 0.5):.3f}s, p99 {percentile(lags, 0.99):.3f}s"
        )
    finally:
        if monitor is not None:
            monitor.send_signal(signal.SIGTERM)
            monitor.wait(timeout=60)
        asyncio.run(delete_prefixed(cfg))
    p99 = percentile(lags, 0.99)
    print(
        json.dumps(
            {
                "events_per_s": round(ours, 1),
                "raw_events_per_s": round(raw, 1),
                "ratio": round(ours / raw, 4),
                "lag_p99_s": round(p99, 3),
            }
        )
    )
