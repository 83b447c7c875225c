"""The monitor's faust app: derived topics in, windowed tables, `/metrics` out.

Sources: `trajectories`, `groups`, `trainer.steps`, `weights.history` and
`sandbox.lifecycle` (the sandbox events the stream worker copies there when a
trajectory folds; faust is never put on `rollout.events`). Faust requires a
table's changelog to have its source topics' partition count, so topics are
grouped by partition count and each group has one agent and three tables:

- `totals-<n>`: cumulative figure state per source partition (counters, gauges, spans);
- `tumbling-<n>`: the same per `monitor.tumbling_s` window;
- `hopping-<n>`: the same per `monitor.hopping_s` window, stepping `monitor.hopping_step_s`.

Table keys are `<topic>:<partition>`, values `figures.FigureState`, which records
the last source offset applied: a record re-read after a crash (faust commits
offsets and writes changelogs separately) is ignored, so the state recovered from
the changelogs on restart is exact. Windows are relative to the record's Kafka
timestamp. `GET /metrics` renders all of it (`exposition.render`); until the tables
are recovered it answers 503, so a scraper never sees a restart as a counter reset.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import faust
from faust.web import Request, Response, View

from streams.heartbeat import start_heartbeat
from streams.monitor.exposition import CONTENT_TYPE, render
from streams.monitor.figures import (
    FigureState,
    Update,
    counters_only,
    empty_state,
    fold_all,
    merge,
    record_update,
)
from streams.monitor.settings import MonitorSettings
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import TopicSpec, partitions, topic_name

SOURCES = ("trajectories", "groups", "trainer.steps", "weights.history", "sandbox.lifecycle")


class Monitor:
    """The faust app and its tables; `app` is run by a faust `Worker`."""

    def __init__(
        self, kafka: KafkaSettings, topics: TopicSettings, settings: MonitorSettings, data_dir: Path
    ) -> None:
        self.settings = settings
        self.replication_factor = topics.replication_factor
        self.app = faust.App(
            topics.prefix + settings.app_id,
            broker=f"kafka://{kafka.bootstrap}",
            store="memory://",
            datadir=str(data_dir),
            web_host=settings.host,
            web_bind=settings.host,
            web_port=settings.port,
            broker_commit_interval=settings.commit_interval_s,
            broker_session_timeout=settings.session_timeout_s,
            broker_heartbeat_interval=min(3.0, settings.session_timeout_s / 3),
            topic_replication_factor=topics.replication_factor,
            table_cleanup_interval=settings.hopping_step_s,
            consumer_auto_offset_reset="earliest",
            web_enabled=True,
            producer_acks=-1,
        )
        self.short = {topic_name(topics, s): s for s in SOURCES}
        by_count: dict[int, list[str]] = defaultdict(list)
        for short in SOURCES:
            by_count[partitions(topics, short)].append(short)
        self.keys: dict[int, list[str]] = {}
        self.tables: list[tuple[Any, Any, Any]] = []
        for count, shorts in sorted(by_count.items()):
            self.keys[count] = [f"{s}:{p}" for s in shorts for p in range(count)]
            self._add_group(count, [topic_name(topics, s) for s in shorts])
        monitor = self

        class Metrics(View):
            async def get(self, request: Request) -> Response:
                if not monitor.ready():  # partial state would read as a counter reset
                    return self.text("recovering tables\n", status=503)
                return self.text(monitor.exposition(), content_type=CONTENT_TYPE)

        self.app.page("/metrics")(Metrics)

        @self.app.task
        async def beat() -> None:  # from faust's own loop, so a stuck monitor stops beating
            start_heartbeat()

    def _add_group(self, count: int, names: list[str]) -> None:
        s = self.settings
        table: dict[str, Any] = {"partitions": count, "default": empty_state}
        totals = self.app.Table(f"totals-{count}", **table)
        tumbling = (
            self.app.Table(f"tumbling-{count}", **table)
            .tumbling(s.tumbling_s, expires=s.window_expires_s)
            .relative_to_stream()
        )
        hopping = (
            self.app.Table(f"hopping-{count}", **table)
            .hopping(s.hopping_s, s.hopping_step_s, expires=s.window_expires_s)
            .relative_to_stream()
        )
        self.tables.append((count, totals, (tumbling, hopping)))
        source = self.app.topic(
            *names, key_type=bytes, value_type=bytes, value_serializer="raw", key_serializer="raw"
        )

        windowed = ((tumbling, s.tumbling_s), (hopping, s.hopping_step_s))

        async def agent(stream: Any) -> None:
            async for events in stream.take_events(s.batch_max_records, within=s.batch_within_s):
                self._fold_batch(stream, events, totals, windowed)

        self.app.agent(source, name=f"fold-{count}")(agent)

    def _fold_batch(self, stream: Any, events: list[Any], totals: Any, windowed: tuple) -> None:
        """One table write per source partition (and window) for a whole batch of records."""
        kept = (self.settings.versions_kept, self.settings.tail_spans_kept)
        by_key: dict[str, list[tuple[Any, Update, int]]] = defaultdict(list)
        for event in events:
            message = event.message
            try:
                envelope = json.loads(event.value)
            except ValueError:
                continue  # not an event: the stream worker dead-letters such records upstream
            short = self.short[message.topic]
            update = record_update(short, envelope, self.settings)
            by_key[f"{short}:{message.partition}"].append((event, update, message.offset))
        for key, items in by_key.items():
            # tables write their changelog to the current event's partition: this key's source partition
            stream._set_current_event(items[-1][0])
            totals[key] = fold_all(totals[key], [(u, o) for _, u, o in items], kept)
            for wrapper, step in windowed:  # records in one step of the window grid share its windows
                steps: dict[int, list[tuple[Any, Update, int]]] = defaultdict(list)
                for item in items:
                    steps[int(item[0].message.timestamp // step)].append(item)
                for group in steps.values():
                    pairs = [(counters_only(u), o) for _, u, o in group]
                    wrapper[key].apply(lambda state, p: fold_all(state, p, kept), pairs, event=group[-1][0])

    def changelog_specs(self) -> list[TopicSpec]:
        """Each table's changelog topic as faust declares it, to be created (`ensure_topics`) before
        faust starts. Faust creates them itself, but checks a changelog's partition count against its
        source's at the first table write; one just created and not yet in the metadata read as 0
        partitions there (PartitionsMismatch in CI), and the monitor died."""
        specs = []
        for table in self.app.tables.values():
            changelog = table.changelog_topic
            policy = ",".join(
                name for name, on in (("compact", changelog.compacting), ("delete", changelog.deleting)) if on
            )
            configs = {"cleanup.policy": policy} if policy else {}
            if changelog.retention:
                configs["retention.ms"] = str(int(float(changelog.retention) * 1000))
            name = changelog.get_topic_name()
            specs.append(TopicSpec(table.name, name, changelog.partitions, self.replication_factor, configs))
        return specs

    def ready(self) -> bool:
        """Tables recovered from their changelogs (and no rebalance recovery under way)."""
        return self.app.tables.recovery.completed.is_set() and not self.app.in_recovery

    def states(self) -> tuple[FigureState, dict[str, FigureState]]:
        """Merged totals, and the merged current window of each window table."""
        kept = self.settings.versions_kept
        totals: list[FigureState] = []
        windows: dict[str, list[FigureState]] = defaultdict(list)
        names = (f"tumbling_{self.settings.tumbling_s:g}s", f"hopping_{self.settings.hopping_s:g}s")
        for count, table, windowed in self.tables:
            for key in self.keys[count]:
                totals.append(table[key])
                for name, wrapper in zip(names, windowed, strict=True):
                    windows[name].append(wrapper[key].now())
        return merge(totals, kept), {name: merge(states, kept) for name, states in windows.items()}

    def exposition(self) -> str:
        totals, windows = self.states()
        return render(totals, windows, self.settings)
