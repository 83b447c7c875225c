"""The records `bench.chaos_counts` counts, read from the topics and from the SQL store.

`from_events(events, run_id)` turns a run's events (in log order) into `Records`; the topics
give them through `read_topics` (every partition from offset 0, every copy of every record)
and the sink's database through `read_sql` (every row of the `events` table, ordered by the
Kafka position it was read from). Only `rollout.requests` is not sunk: the requested ids
come from the topic in both counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import select

from bench.chaos_counts import Assembled, Finish, GroupRecord, StepRecord
from streams.bus import read_topic
from streams.events import Event
from streams.payloads import (
    GroupFormed,
    RolloutRequested,
    TrainerStep,
    TrajectoryAssembled,
    TrajectoryFinished,
    TurnGenerated,
    WeightsPublished,
)
from streams.settings import KafkaSettings, TopicSettings
from streams.store import event_from_row, open_readonly
from streams.store.models import EventRow

TOPICS = ("rollout.requests", "rollout.events", "trajectories", "groups", "trainer.steps", "weights.history")
SQL_TYPES = ("trajectory.finished", "group.formed", "trainer.step", "weights.published", "turn.generated")


@dataclass
class Records:
    requested: list[str] = field(default_factory=list)
    finishes: list[Finish] = field(default_factory=list)
    assembled: list[Assembled] = field(default_factory=list)
    groups: list[GroupRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    published: list[int] = field(default_factory=list)
    generated_versions: set[int] = field(default_factory=set)
    sandbox_failed_injected: int = 0


def from_events(events: Iterable[Event], run_id: str) -> Records:
    """One run's records, in the order given (log order: groups in offset order)."""
    out = Records()
    for event in events:
        if event.run_id != run_id:
            continue
        _add(out, event)
    return out


def _add(out: Records, event: Event) -> None:
    data, eid = event.data, str(event.id)
    if isinstance(data, RolloutRequested) and event.trajectory_id:
        out.requested.append(event.trajectory_id)
    elif isinstance(data, TrajectoryFinished) and event.trajectory_id:
        out.finishes.append(Finish(event.trajectory_id, eid, str(data.outcome), data.reward, data.injected))
    elif isinstance(data, TrajectoryAssembled) and event.trajectory_id:
        out.assembled.append(Assembled(event.trajectory_id, eid, str(data.outcome), data.reward))
    elif isinstance(data, GroupFormed) and event.group_id:
        out.groups.append(GroupRecord(event.group_id, eid, tuple(data.members), data.dropped))
    elif isinstance(data, TrainerStep) and data.mode == "rl":
        out.steps.append(StepRecord(data.step, eid, tuple(data.group_ids)))
    elif isinstance(data, WeightsPublished):
        out.published.append(data.version)
    elif isinstance(data, TurnGenerated):
        out.generated_versions.update(data.output_versions)
    elif event.type == "sandbox.failed" and getattr(data, "injected", False):
        out.sandbox_failed_injected += 1


async def read_topics(kafka: KafkaSettings, topics: TopicSettings, run_id: str) -> Records:
    events: list[Event] = []
    for short in TOPICS:
        consumed = await read_topic(kafka, topics, short, idle_s=3.0)
        consumed.sort(key=lambda c: (c.partition, c.offset))
        events.extend(c.event for c in consumed)
    return from_events(events, run_id)


def read_sql(url: str, run_id: str) -> Records:
    engine = open_readonly(url)
    try:
        with engine.connect() as connection:
            query = (
                select(EventRow.__table__)
                .where(EventRow.run_id == run_id)
                .where(EventRow.type.in_((*SQL_TYPES, "sandbox.failed")))
                .order_by(EventRow.kafka_topic, EventRow.kafka_partition, EventRow.kafka_offset)
            )
            events = [event_from_row(row) for row in connection.execute(query)]
    finally:
        engine.dispose()
    return from_events(events, run_id)
