"""Replay a run from the log: the same processor as the stream worker, over recorded events.

Sources: the topics from offset 0 (`load_from_topics`, via `streams.bus.read_topic`)
or the SQL store's `events` table (`load_from_db`, plain SQL on the store's URL,
so replay does not depend on the store's code; the store keeps every run's copy
of an event id, as the topics do, read back in Kafka order). Either gives a `RecordedRun`:
the run's rollout events, its weight versions, and what the stream workers
wrote (`trajectories`, `groups`) where the source has them.

`by_trajectory(events)` groups the events per trajectory, dropping only exact
copies (same id and source): a re-run after its rollout worker was killed writes
the same ids as the killed run's partial copy, and both are kept so that
`fold_trajectory` and the processor pick the finishing run's, as a live worker does.
`fold_episodes(episodes)` folds the complete ones (no policy involved).

`replay(run, policy, cut)` feeds the events to a fresh `StreamProcessor`
(optionally cutting episodes to stricter length limits first, for what-if),
observes every weight version, forms the groups still open at the end of the
log from what they have, and returns the records a worker would have written,
plus the folded trajectories. `compare(recorded, replayed)` lists every
difference (missing, extra or changed records by id); with the recorded
policies the expected answer is none.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import create_engine, text

from streams.assemble import MalformedTrajectory, Trajectory, dedupe_by_seq, fold_trajectory
from streams.bus import read_topic
from streams.events import DecodeError, Event, event_from_dict
from streams.payloads import Limits
from streams.policies import truncate_events
from streams.processor import Emit, StreamProcessor
from streams.settings import KafkaSettings, PolicySettings, TopicSettings


@dataclass(frozen=True)
class RecordedRun:
    """A run as the log has it: rollout events, weight versions, and the workers' output records."""

    run_id: str
    events: list[Event] = field(default_factory=list)
    weights: list[Event] = field(default_factory=list)
    trajectories: list[Event] = field(default_factory=list)
    groups: list[Event] = field(default_factory=list)

    def recorded_policy(self) -> PolicySettings | None:
        """The policy the stream workers recorded on this run's first group, if any."""
        first = min(self.groups, key=lambda e: (e.time_ns, str(e.id)), default=None)
        return first.data.policy if first is not None else None  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Replayed:
    trajectories: list[Event]
    groups: list[Event]
    folded: list[Trajectory]


async def load_from_topics(kafka: KafkaSettings, topics: TopicSettings, run_id: str) -> RecordedRun:
    run = RecordedRun(run_id)
    for short, target in (
        ("rollout.events", run.events),
        ("weights.history", run.weights),
        ("trajectories", run.trajectories),
        ("groups", run.groups),
    ):
        target += [c.event for c in await read_topic(kafka, topics, short) if c.event.run_id == run_id]
    return run


EVENT_COLUMNS = ", ".join((*Event.ENVELOPE_FIELDS, "data"))


def load_from_db(url: str, run_id: str) -> RecordedRun:
    """The run's events from the SQL store's `events` table (rollout events, weights, groups).

    Every copy the store holds (one per id and source), in the order the topics had them:
    where a killed run and its re-run both finished a trajectory, the first one read wins."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text(
                    f"SELECT {EVENT_COLUMNS} FROM events WHERE run_id = :run "
                    "ORDER BY kafka_topic, kafka_partition, kafka_offset"
                ),
                {"run": run_id},
            ).mappings()
            events = [_event_of(row) for row in rows]
    finally:
        engine.dispose()
    run = RecordedRun(run_id)
    for event in events:
        if event.type == "weights.published":
            run.weights.append(event)
        elif event.type == "group.formed":
            run.groups.append(event)
        elif event.type == "trajectory.assembled":
            run.trajectories.append(event)
        elif event.trajectory_id:
            run.events.append(event)
    return run


def _event_of(row: Any) -> Event:
    raw = dict(row)
    if isinstance(raw["data"], str):
        raw["data"] = json.loads(raw["data"])
    raw = {k: v for k, v in raw.items() if v is not None or k in ("data",)}
    try:
        return event_from_dict(raw)
    except DecodeError as error:
        raise DecodeError(f"events row {raw.get('id')}: {error.reason}") from None


def by_trajectory(events: Sequence[Event]) -> dict[str, list[Event]]:
    """Each trajectory's events in seq order, one of each (id, source): copies of an id written
    by another run (a re-run after a killed worker) are kept for `fold_trajectory` to choose."""
    grouped: dict[str, dict[tuple[Any, str], Event]] = defaultdict(dict)
    for event in events:
        grouped[event.trajectory_id or ""].setdefault((event.id, event.source), event)
    return {t: sorted(evs.values(), key=lambda e: e.seq) for t, evs in grouped.items()}


def fold_episodes(episodes: Iterable[Sequence[Event]]) -> list[Trajectory]:
    """The complete trajectories of these episodes (malformed and unfinished ones left out)."""
    folded = []
    for events in episodes:
        try:
            trajectory = fold_trajectory(events)
        except MalformedTrajectory:
            continue
        if isinstance(trajectory, Trajectory):
            folded.append(trajectory)
    return folded


def replay(run: RecordedRun, policy: PolicySettings, cut: Limits | None = None) -> Replayed:
    """What a stream worker with `policy` writes for this run (episodes cut to `cut` first)."""
    processor = StreamProcessor(policy)
    for weights in run.weights:
        processor.observe_weights(weights)
    episodes = by_trajectory(run.events)
    if cut is not None:
        episodes = {t: _cut(evs, cut) for t, evs in episodes.items()}
    stream = sorted((e for evs in episodes.values() for e in evs), key=lambda e: (e.time_ns, e.seq))
    outputs = [o for e in stream for o in processor.feed(e)] + processor.finish_all()
    emitted = [o for o in outputs if isinstance(o, Emit)]
    return Replayed(
        trajectories=[o.event for o in emitted if o.topic == "trajectories"],
        groups=[o.event for o in emitted if o.topic == "groups"],
        folded=fold_episodes(episodes.values()),
    )


def _cut(events: list[Event], limits: Limits) -> list[Event]:
    """A complete episode cut to `limits`, from the copy that folds (`dedupe_by_seq`); others as they are."""
    try:
        complete = isinstance(fold_trajectory(events), Trajectory)
    except MalformedTrajectory:
        return events
    if not complete:
        return events
    return truncate_events(sorted(dedupe_by_seq(events).values(), key=lambda e: e.seq), limits)


def compare(recorded: Sequence[Event], replayed: Sequence[Event], label: str) -> list[str]:
    """Differences between recorded and replayed records (by id; payloads compared whole)."""
    old = {e.id: e for e in recorded}
    new = {e.id: e for e in replayed}
    out = [
        f"{label}: {old[i].group_id}/{old[i].trajectory_id} recorded but not replayed"
        for i in old.keys() - new.keys()
    ]
    out += [
        f"{label}: {new[i].group_id}/{new[i].trajectory_id} replayed but not recorded"
        for i in new.keys() - old.keys()
    ]
    for i in old.keys() & new.keys():
        a, b = old[i].data.model_dump(), new[i].data.model_dump()
        if a != b:
            fields = sorted(k for k in a if a[k] != b.get(k))
            out.append(
                f"{label}: {old[i].group_id}/{old[i].trajectory_id or ''} differs in {', '.join(fields)}"
            )
    return sorted(out)
