"""The SQL sink: Kafka's source-of-truth topics into the event store, exactly once.

Exactly once into SQL, whenever the process is killed (SIGKILL included):

- The sink's position lives in the database (`consumer_offsets`), never in
  Kafka. Each batch's events, their projections and the next offset of every
  partition the batch touched are written in ONE database transaction
  (`streams.store.write_batch`). The offset written for a partition is exactly
  the last offset of that partition's records in the batch + 1, whether those
  records became rows, were duplicates, or went to the dead-letter topic.
- The sink is a single process that assigns itself every partition of
  `StoreSettings.sink_topics` by hand (`assign`, no consumer group): there is
  no rebalance, so the only assignment is at start-up, and right after it, with
  no await in between, every partition is seeked to its stored offset (0 when
  none). No fetch can run from another position (Kafka's committed offsets are
  never read or written). A consumer group with a rebalance listener would add
  a moment after each rebalance where positions come from Kafka; one sink per
  database needs no group. Partitions added to a topic later are picked up
  on the sink's next start.
- Undecodable records go to `deadletter` (acknowledged) before the transaction
  that moves past them commits; after a crash they may be dead-lettered again,
  with the same dead-letter event id.
- A record read twice is stored once (events are keyed by id and source); a
  re-run's copy of a killed rollout worker's events is stored beside the partial
  copy, and the projections show the run that finished the trajectory, chosen by
  the same rule as the stream worker and replay (`streams.store.writer`).

Database work runs in a worker thread, so the next batch is fetched and decoded
while one commits (one commit in flight, in order). Each statement that thread
runs gives up the GIL while the database works and must take it back from the
decoding loop; while the sink runs, Python's switch interval is
`StoreSettings.sink_gil_switch_ms` (process-wide, restored after), so that
hand-over waits at most that long instead of Python's 5 ms.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from sqlalchemy import Engine

from streams.bus import EventProducer, behind, collector_paused, dead_letter_event, raw_consumer
from streams.events import DecodeError
from streams.settings import KafkaSettings, StoreSettings, TopicSettings
from streams.store import StoredEvent, load_offsets, write_batch
from streams.store.wire import decode_record
from streams.store.writer import PreparedBatch, prepare_batch
from streams.topics import list_topics, topic_name


class SinkError(RuntimeError):
    """The sink cannot run (missing topics, unusable database); the message says what to do."""


@dataclass(frozen=True)
class RejectedRecord:
    """A record that is not a valid event, with the reason for the dead-letter topic."""

    record: ConsumerRecord
    reason: str


@dataclass(frozen=True)
class SinkBatch:
    """What one poll returned: the valid events' rows, rejected records, next offset per (topic, partition).

    The decoded events themselves are not kept: once their rows are built they are freed, while
    the collector is paused, so it never scans them (`collector_paused`)."""

    rows: PreparedBatch
    rejected: list[RejectedRecord]
    offsets: dict[tuple[str, int], int]

    @property
    def valid(self) -> int:
        """How many records decoded to valid events."""
        return len(self.rows.event_rows)


@dataclass
class SinkProgress:
    """Running totals, handed to the progress callback after every batch."""

    records: int = 0
    stored: int = 0
    duplicates: int = 0
    deadlettered: int = 0
    batches: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def rate(self) -> float:
        """Records per second since start."""
        return self.records / max(self.elapsed_s, 1e-9)


def split_batch(polled: Mapping[TopicPartition, list[ConsumerRecord]]) -> SinkBatch:
    """Decode every record and build its rows; the offsets cover every record, valid or not (pure)."""
    events: list[StoredEvent] = []
    rejected: list[RejectedRecord] = []
    offsets: dict[tuple[str, int], int] = {}
    for tp, records in polled.items():
        if not records:
            continue
        for record in records:
            try:
                event, data_json = decode_record(record.value or b"")
            except DecodeError as error:
                rejected.append(RejectedRecord(record, error.reason))
                continue
            events.append(StoredEvent(event, tp.topic, tp.partition, record.offset, data_json))
        offsets[(tp.topic, tp.partition)] = max(record.offset for record in records) + 1
    return SinkBatch(prepare_batch(events), rejected, offsets)


async def sink_partitions(
    kafka: KafkaSettings, topics: TopicSettings, store: StoreSettings
) -> list[TopicPartition]:
    """Every partition of the sink topics as the broker describes them now."""
    names = [topic_name(topics, short) for short in store.sink_topics]
    described = await list_topics(kafka, topics)
    missing = [name for name in names if name not in described]
    if missing:
        raise SinkError(f"topics {missing} do not exist on {kafka.bootstrap}; run `rollstream topics create`")
    return [
        TopicPartition(name, index) for name in names for index in range(int(described[name]["partitions"]))
    ]


class DeadLetters:
    """The `deadletter` producer, started on the first rejected record (most runs never need it)."""

    def __init__(self, kafka: KafkaSettings, topics: TopicSettings, stack: contextlib.AsyncExitStack) -> None:
        self.kafka, self.topics, self.stack = kafka, topics, stack
        self.producer: EventProducer | None = None

    async def send_all(self, rejected: list[RejectedRecord], consumer: str) -> None:
        """Send a dead-letter event per record and wait until all are acknowledged."""
        if not rejected:
            return
        if self.producer is None:
            self.producer = await self.stack.enter_async_context(EventProducer(self.kafka, self.topics))
        for item in rejected:
            await self.producer.send("deadletter", dead_letter_event(item.record, item.reason, consumer))
        await self.producer.flush()


@contextlib.contextmanager
def switch_interval(seconds: float) -> Iterator[None]:
    """Python's thread switch interval set to `seconds` for the block (process-wide), then restored."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


class Sink:
    """Consumes `store.sink_topics` into `engine`; `run()` until stopped or idle."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        store: StoreSettings,
        engine: Engine,
        progress: Callable[[SinkProgress], None] | None = None,
    ) -> None:
        self.kafka, self.topics, self.store, self.engine = kafka, topics, store, engine
        self.name = store.sink_group  # the key of this sink's rows in `consumer_offsets`
        self.progress = progress or (lambda _p: None)
        self.totals = SinkProgress()
        self.stopping = asyncio.Event()

    def stop(self) -> None:
        """Finish the batch in hand, then return from `run`."""
        self.stopping.set()

    async def run(self, until_idle_s: float | None = None) -> SinkProgress:
        """Sink until `stop()`, or until caught up with nothing new for `until_idle_s` seconds."""
        # Here, not in __init__: aiokafka needs the running loop. No group: partitions are assigned
        # by hand, positions come from the database; the earliest offset is used only when a stored
        # offset fell out of retention.
        consumer = raw_consumer(self.kafka, [], None, "sink", from_beginning=True)
        await consumer.start()
        try:
            partitions = await self._assign_from_store(consumer)
            async with contextlib.AsyncExitStack() as stack:
                dead_letters = DeadLetters(self.kafka, self.topics, stack)
                with switch_interval(self.store.sink_gil_switch_ms / 1000):
                    await self._loop(consumer, dead_letters, partitions, until_idle_s)
        finally:
            await consumer.stop()
        return self.totals

    async def _assign_from_store(self, consumer: AIOKafkaConsumer) -> list[TopicPartition]:
        partitions = await sink_partitions(self.kafka, self.topics, self.store)
        stored = await asyncio.to_thread(self._load_offsets)
        ends = await consumer.end_offsets(partitions)
        ahead = [
            f"{tp.topic}[{tp.partition}]"
            for tp in partitions
            if stored.get((tp.topic, tp.partition), 0) > ends[tp]
        ]
        if ahead:  # re-reading recreated topics would collide with rows stored at the same positions
            raise SinkError(
                f"the database has offsets past the end of {', '.join(ahead)}: the topics were recreated "
                "after it was written; sink into a fresh database (--db)"
            )
        consumer.assign(partitions)
        for tp in partitions:  # no await between assign and seek: nothing is fetched before this
            consumer.seek(tp, stored.get((tp.topic, tp.partition), 0))
        return partitions

    def _load_offsets(self) -> dict[tuple[str, int], int]:
        with self.engine.connect() as conn:
            return load_offsets(conn, self.name)

    async def _loop(
        self,
        consumer: AIOKafkaConsumer,
        dead_letters: DeadLetters,
        partitions: list[TopicPartition],
        until_idle_s: float | None,
    ) -> None:
        """Poll, decode, commit; batch N+1 is fetched and decoded while batch N commits.

        At most one commit is in flight and each waits for the one before, so batches
        commit in the order they were read."""
        idle_since = time.monotonic()
        committing: asyncio.Task[None] | None = None
        try:
            while not self.stopping.is_set():
                polled = await consumer.getmany(
                    timeout_ms=self.store.sink_poll_ms, max_records=self.store.sink_batch_size
                )
                with collector_paused():  # see `collector_paused`; no await inside
                    batch = split_batch(polled)
                    del polled  # the records are freed here, unscanned, as the decoded events were
                if committing is not None and (batch.offsets or committing.done()):
                    await committing
                    committing = None
                if batch.offsets:
                    committing = asyncio.create_task(self._apply(dead_letters, batch))
                    # Let the task reach its thread now: the next getmany may return buffered
                    # records without yielding, and the commit would then wait for the next decode.
                    await asyncio.sleep(0)
                    idle_since = time.monotonic()
                elif until_idle_s is not None and time.monotonic() - idle_since >= until_idle_s:
                    if committing is not None:
                        await committing
                        committing = None
                    if await self._caught_up(consumer, partitions):
                        return
                    idle_since = time.monotonic()
        finally:
            if committing is not None:
                await committing

    async def _apply(self, dead_letters: DeadLetters, batch: SinkBatch) -> None:
        await dead_letters.send_all(batch.rejected, self.name)  # acked before the offsets move past them
        new = await asyncio.to_thread(self._commit, batch)
        totals = self.totals
        totals.records += batch.valid + len(batch.rejected)
        totals.stored += new
        totals.duplicates += batch.valid - new
        totals.deadlettered += len(batch.rejected)
        totals.batches += 1
        self.progress(totals)

    def _commit(self, batch: SinkBatch) -> int:
        with self.engine.begin() as conn:
            return write_batch(conn, batch.rows, batch.offsets, self.name)

    async def _caught_up(self, consumer: AIOKafkaConsumer, partitions: list[TopicPartition]) -> bool:
        """Every partition's position has reached its end offset (nothing left to read)."""
        return not await behind(consumer, await consumer.end_offsets(partitions))
