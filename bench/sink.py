"""`rollstream bench sink`: events/s into the event store through the sink vs a plain batched insert.

Our path: `--events` unique realistic events (the `streams.eventgen` sample mix,
turn.generated with `--tokens` tokens and logprobs) are produced to fresh topics
first; then `streams.sink.Sink` reads them from Kafka into a fresh store
(decode, events + projections + offsets per transaction), timed from start until
the last record is committed. Baseline: the very rows the sink stored, read
back, inserted into another fresh store on the same backend with plain batched
SQLAlchemy `insert(events)` executemany, one transaction per `db.sink_batch_size`
rows. Both open their store as the sink command does (`open_store` with the
config's `db.sqlite_cache_mib`).

`--db sqlite` (default): SQLite files in a temporary directory. `--db postgresql`:
the local PostgreSQL server (`[postgres]` of the config; started if none answers,
and stopped again then). `--db postgresql+psycopg://user@host:port/db`: that
server; the user must be allowed to create databases. On PostgreSQL each store is
a fresh database, dropped after its round.

Rounds alternate the two paths (fresh stores each time) and the medians are
reported, with the process's CPU time per event on each path (user + system, all
threads: a figure a loaded machine moves less than the wall-clock ratio). Last line:
`{"db": ..., "events_per_s": ..., "raw_events_per_s": ..., "ratio": ..., "cpu_us_per_event": ...,
"raw_cpu_us_per_event": ...}` (target: ratio >= 0.5).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import insert, select

from bench.figures import median_rates
from bench.local_broker import ensure_local_broker, fresh_topics
from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.config import Config
from rollstream.launcher import postgres
from rollstream.launcher.process import LauncherError
from streams.bus import EventProducer
from streams.eventgen import bench_mix
from streams.events import Event, event_id
from streams.settings import TopicSettings
from streams.sink import Sink, SinkProgress
from streams.store import open_store
from streams.store.models import EventRow
from streams.topics import delete_topics

TOPIC = "rollout.events"
UNIQUE_EVENTS = 4096  # generated once; copies get their own ids and trajectories (generation is not measured)


def unique_events(count: int, tokens: int) -> list[Event]:
    """`count` events with distinct ids and trajectories, cycling through a generated mix."""
    base = bench_mix(min(count, UNIQUE_EVENTS), tokens)
    out = []
    for i in range(count):
        event = base[i % len(base)]
        if i >= len(base):
            copy = f"c{i // len(base)}"
            update: dict[str, Any] = {"id": event_id(f"{event.id}/{copy}", event.seq)}
            if event.trajectory_id:
                update["trajectory_id"] = f"{event.trajectory_id}/{copy}"
            event = event.model_copy(update=update)
        out.append(event)
    return out


async def produce(
    config: Config, topics: TopicSettings, events: list[Event], on_progress: Callable[[int], None]
) -> None:
    async with EventProducer(config.kafka, topics) as producer:
        for index, event in enumerate(events, 1):
            await producer.send(TOPIC, event)
            if index % 5000 == 0:
                on_progress(index)
        await producer.flush()
    on_progress(len(events))


@dataclass(frozen=True)
class Elapsed:
    """Wall seconds, and this process's CPU seconds in that time (all threads, user + system)."""

    wall_s: float
    cpu_s: float


class Timer:
    """Started when made; `stop()` is the `Elapsed` since."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), _cpu_s()

    def stop(self) -> Elapsed:
        return Elapsed(time.perf_counter() - self.wall, _cpu_s() - self.cpu)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def sink_into(
    config: Config, topics: TopicSettings, url: str, count: int, on_progress: Callable[[int], None]
) -> Elapsed:
    """Time for the sink to store `count` records into a fresh store at `url`."""
    engine = open_store(url, config.db.sqlite_cache_mib)
    store = config.db.model_copy(update={"sink_topics": (TOPIC,)})
    sink: Sink

    def progress(totals: SinkProgress) -> None:
        on_progress(totals.records)
        if totals.records >= count:
            sink.stop()

    sink = Sink(config.kafka, topics, store, engine, progress=progress)
    timer = Timer()
    totals = await sink.run()
    elapsed = timer.stop()
    engine.dispose()
    if totals.stored != count:
        raise RuntimeError(f"the sink stored {totals.stored} of {count} events")
    return elapsed


def plain_insert(
    rows: list[dict[str, Any]], url: str, config: Config, on_progress: Callable[[int], None]
) -> Elapsed:
    """Time to insert `rows` into `events` of a fresh store, `db.sink_batch_size` rows per transaction."""
    batch = config.db.sink_batch_size
    engine = open_store(url, config.db.sqlite_cache_mib)
    timer = Timer()
    for first in range(0, len(rows), batch):
        with engine.begin() as conn:
            conn.execute(insert(EventRow), rows[first : first + batch])
        on_progress(min(first + batch, len(rows)))
    elapsed = timer.stop()
    engine.dispose()
    return elapsed


def stored_rows(url: str) -> list[dict[str, Any]]:
    engine = open_store(url)
    with engine.connect() as conn:
        rows = [dict(row._mapping) for row in conn.execute(select(EventRow.__table__))]
    engine.dispose()
    return rows


class FreshStores:
    """Empty event stores on one backend: SQLite files in `workdir`, or databases on a PostgreSQL
    server (`admin`: a URL whose user may create databases); `clear()` removes every one made."""

    def __init__(self, admin: str | None, workdir: Path) -> None:
        self.admin, self.workdir = admin, workdir
        self.databases: list[str] = []

    def new(self, label: str) -> str:
        if self.admin is None:
            return f"sqlite:///{self.workdir / f'{label}.db'}"
        self.databases.append(f"bench_sink_{uuid.uuid4().hex[:8]}_{label}")
        return postgres.create_database(self.admin, self.databases[-1])

    def clear(self) -> None:
        for path in self.workdir.iterdir():
            path.unlink()
        for name in self.databases:
            postgres.drop_database(self.admin or "", name)
        self.databases.clear()


async def one_round(
    config: Config, topics: TopicSettings, count: int, stores: FreshStores, progress: Progress, label: str
) -> tuple[Elapsed, Elapsed]:
    """Time for the sink, then for the plain insert of the rows it stored (fresh stores each)."""
    try:
        sink_url, raw_url = stores.new("sink"), stores.new("raw")
        sink_task = progress.add_task(f"{label} sink", total=count)
        sink_time = await sink_into(
            config, topics, sink_url, count, lambda n: progress.update(sink_task, completed=n)
        )
        rows = stored_rows(sink_url)
        raw_task = progress.add_task(f"{label} plain insert", total=count)
        raw_time = plain_insert(rows, raw_url, config, lambda n: progress.update(raw_task, completed=n))
    finally:
        stores.clear()  # the next round starts from empty stores
    return sink_time, raw_time


async def run(config: Config, count: int, tokens: int, rounds: int, stores: FreshStores) -> dict[str, float]:
    events = unique_events(count, tokens)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    topics = await fresh_topics(config, "bench-sink")
    ours: list[float] = []
    raw: list[float] = []
    cpu: dict[str, list[float]] = {"cpu_us_per_event": [], "raw_cpu_us_per_event": []}
    try:
        with Progress(*columns, console=console) as progress:
            produced = progress.add_task("produce", total=count)
            await produce(config, topics, events, lambda n: progress.update(produced, completed=n))
            for number in range(1, rounds + 1):
                sink_time, raw_time = await one_round(
                    config, topics, count, stores, progress, f"round {number}"
                )
                ours.append(count / sink_time.wall_s)
                raw.append(count / raw_time.wall_s)
                cpu["cpu_us_per_event"].append(1e6 * sink_time.cpu_s / count)
                cpu["raw_cpu_us_per_event"].append(1e6 * raw_time.cpu_s / count)
                progress.console.print(
                    f"round {number}: sink {ours[-1]:,.0f} events/s, plain insert {raw[-1]:,.0f} events/s"
                )
    finally:
        await delete_topics(config.kafka, topics)
    medians = {name: round(statistics.median(values), 1) for name, values in cpu.items()}
    return {"events": count, "rounds": rounds, **median_rates(ours, raw), **medians}


@contextlib.contextmanager
def postgres_server(cfg: Config, db: str) -> Iterator[str | None]:
    """The admin URL of the PostgreSQL server `--db` names (None for sqlite); the local server is
    started if none answers, and then stopped again at the end."""
    if db != "postgresql":
        yield None if db == "sqlite" else db
        return
    was_up = postgres.is_up(cfg)
    try:
        admin = postgres.ensure_up(cfg)
    except LauncherError as error:
        fail(str(error))
    try:
        yield admin
    finally:
        if not was_up:
            postgres.down(cfg)


def command(
    config: ConfigPath = None,
    overrides: Overrides = None,
    events: Annotated[int, typer.Option(help="events to sink")] = 100_000,
    tokens: Annotated[int, typer.Option(help="output tokens per turn.generated")] = 300,
    rounds: Annotated[int, typer.Option(help="rounds of both paths (alternating); medians reported")] = 3,
    db: Annotated[
        str,
        typer.Option(
            help="sqlite, postgresql (the local server), or a postgresql+psycopg:// URL whose user "
            "may create databases; both paths write there"
        ),
    ] = "sqlite",
) -> None:
    """Events/s into the event store through the sink (from Kafka) vs a plain batched insert (target 0.5)."""
    if db != "sqlite" and not db.startswith("postgresql"):
        fail(f"--db {db!r}: use sqlite, postgresql, or a postgresql+psycopg://user@host:port/db URL")
    cfg = read_config(config, overrides)
    ensure_local_broker(cfg)
    workdir = cfg.state_dir if cfg.state_dir.exists() else None
    with (
        tempfile.TemporaryDirectory(prefix="rollstream-bench-sink-", dir=workdir) as sqlite_dir,
        postgres_server(cfg, db) as admin,
    ):
        result = asyncio.run(run(cfg, events, tokens, rounds, FreshStores(admin, Path(sqlite_dir))))
    print(json.dumps({"db": "sqlite" if admin is None else "postgresql", **result}))
