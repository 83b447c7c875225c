"""Trajectories already finished on the log: requests a rollout worker must not run again.

A worker killed after a trajectory's `trajectory.finished` was acked, but before its
request's offset was committed, leaves that request to the partition's next owner. A re-run
writes the same event ids only when it replays bitwise; one that does not (a sandbox fault
drawn by another process's counter, an abort read at another turn, an engine whose batching
is not deterministic) writes a second, different finished record of one trajectory, which
every consumer would count twice. So a worker that takes over partitions first reads
`rollout.events` from shortly before the oldest request it was handed (`since_ns`, the
request's own time, less `rollout.finished_lookback_s` for clocks that differ between
machines) to the end, and keeps each trajectory's first outcome: a request of one of them is
marked done instead of run, and only its after-finish step (the infra re-run request, whose
event id is fixed) is written again.

`finished_outcomes` is the pure fold; `finished_since` reads the topic.
"""

from __future__ import annotations

from collections.abc import Iterable

from streams.bus import read_topic_since
from streams.events import Event
from streams.outcomes import Outcome
from streams.payloads import TrajectoryFinished
from streams.settings import KafkaSettings, TopicSettings

FINISHED_MARKER = b'"trajectory.finished"'  # in every finished record's bytes: skip decoding the rest


def finished_outcomes(events: Iterable[Event]) -> dict[str, Outcome]:
    """trajectory id -> outcome of its first `trajectory.finished` among `events`."""
    outcomes: dict[str, Outcome] = {}
    for event in events:
        if isinstance(event.data, TrajectoryFinished) and event.trajectory_id:
            outcomes.setdefault(event.trajectory_id, event.data.outcome)
    return outcomes


async def finished_since(kafka: KafkaSettings, topics: TopicSettings, since_ns: int) -> dict[str, Outcome]:
    """Outcomes of the trajectories finished on `rollout.events` at or after `since_ns`."""
    since_ms = since_ns // 1_000_000
    records = await read_topic_since(kafka, topics, "rollout.events", since_ms, marker=FINISHED_MARKER)
    return finished_outcomes(record.event for record in records)
