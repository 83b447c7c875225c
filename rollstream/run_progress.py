"""Following a run while it happens: trajectories finishing, groups forming, the sink catching up.

Read-only views of the topics and the SQL store with rich progress bars; each
wait checks that the pipeline's processes are still alive and gives up with a
`TimeoutError` after its deadline instead of hanging.
"""

from __future__ import annotations

import asyncio
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy import Connection, TextClause, create_engine, text

from rollstream.command_line import console
from rollstream.config import Config
from rollstream.supervisor import Supervisor
from streams.bus import EventConsumer, read_topic


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
    )


async def wait_for_groups(
    cfg: Config, run_id: str, expected_groups: int, pipeline: Supervisor, timeout_s: float
) -> None:
    """Follow `rollout.events` and `groups` until every group of the run has formed (or dropped)."""
    deadline = time.monotonic() + timeout_s
    expected_trajectories = expected_groups * cfg.policy.group_size
    finished: set[str] = set()
    groups: dict[str, str] = {}
    with _progress() as progress:
        bar_t = progress.add_task("trajectories finished", total=expected_trajectories, note="")
        bar_g = progress.add_task("groups formed", total=expected_groups, note="")
        shorts = ("rollout.events", "groups")
        async with EventConsumer(cfg.kafka, cfg.topics, shorts, group_id=None, name="demo") as consumer:
            while len(groups) < expected_groups:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{len(groups)} of {expected_groups} groups formed within {timeout_s:.0f} s"
                    )
                pipeline.check_alive()
                for item in await consumer.batch(timeout_ms=500):
                    event = item.event
                    if event.run_id != run_id:
                        continue
                    if event.type == "trajectory.finished" and event.trajectory_id:
                        finished.add(event.trajectory_id)
                    elif event.type == "group.formed" and event.group_id:
                        groups[event.group_id] = event.data.dropped or "kept"  # type: ignore[attr-defined]
                progress.update(
                    bar_t,
                    completed=min(len(finished), expected_trajectories),
                    note=f"{len(finished)} incl. re-runs",
                )
                kept = sum(1 for v in groups.values() if v == "kept")
                progress.update(bar_g, completed=len(groups), note=f"{kept} kept")


async def wait_for_sink(cfg: Config, run_id: str, pipeline: Supervisor, timeout_s: float) -> None:
    """Wait until the SQL store holds every rollout event of the run that the topic holds."""
    on_topic = sum(
        1 for c in await read_topic(cfg.kafka, cfg.topics, "rollout.events") if c.event.run_id == run_id
    )
    engine = create_engine(cfg.db_url)
    query = text("SELECT count(*) FROM events WHERE run_id = :run AND type NOT IN ('group.formed')")
    deadline = time.monotonic() + timeout_s
    try:
        with _progress() as progress:
            bar = progress.add_task("events in the SQL store", total=on_topic, note=cfg.db_url)
            while True:
                pipeline.check_alive()
                with engine.connect() as connection:
                    stored = _count(connection, query, run_id)
                progress.update(bar, completed=min(stored, on_topic))
                if stored >= on_topic:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the sink stored {stored} of {on_topic} events in {timeout_s:.0f} s")
                await asyncio.sleep(0.5)
    finally:
        engine.dispose()


def _count(connection: Connection, query: TextClause, run_id: str) -> int:
    try:
        return int(connection.execute(query, {"run": run_id}).scalar_one())
    except Exception as error:  # the table appears once the sink has migrated the database
        if "no such table" in str(error) or "does not exist" in str(error):
            return 0
        raise
