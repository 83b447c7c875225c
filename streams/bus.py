"""The Kafka bus: `EventProducer` (see `streams.producer`), `EventConsumer`, `read_topic`.

Consumer: auto commit off; `batch` returns decoded events with their short topic,
partition and offset. A record that is not a valid event (not JSON, unknown type,
schema violation) becomes a `deadletter.record` event on `deadletter` (reason,
source topic, partition, offset, original bytes) and is skipped; `commit` first
makes sure those dead letters are acked, so no bad record is lost by committing
past it. `read_topic` reads a whole topic from offset 0 to its current end;
`read_topic_ids` reads only the event ids of one (the stream worker's read-back).
"""

from __future__ import annotations

import base64
import contextlib
import gc
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition

from streams.aiokafka_private import refresh_metadata
from streams.events import DecodeError, Event, decode_event, make_event
from streams.fast_decode import decode_event_fast
from streams.payloads import DeadLetterRecord
from streams.producer import BusError, EventProducer
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import topic_name

__all__ = [
    "BusError",
    "Consumed",
    "EventConsumer",
    "EventProducer",
    "behind",
    "collector_paused",
    "dead_letter",
    "dead_letter_event",
    "raw_consumer",
    "read_topic",
    "read_topic_ids",
]

logger = logging.getLogger(__name__)
_ID_PREFIX = re.compile(rb'^\{"id":"([0-9a-f-]{36})"')  # `encode_event` writes the id first


@dataclass(frozen=True)
class Consumed:
    event: Event
    topic: str  # short name, e.g. "rollout.events"
    partition: int
    offset: int


class EventConsumer:
    """Reads events from short-named topics; bad records go to `deadletter`."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        shorts: Sequence[str],
        *,
        group_id: str | None,
        name: str,
        from_beginning: bool = True,
        subscribe: bool = True,
    ) -> None:
        """`subscribe=False`: nothing is subscribed; the caller assigns partitions by hand
        (`consumer.assign`, then seeks), as the trainer does to resume at checkpointed offsets."""
        self._kafka = kafka
        self._topics = topics
        self._names = [topic_name(topics, short) for short in shorts]
        self._short = {topic_name(topics, short): short for short in shorts}
        self._group_id = group_id
        self.name = name
        self.consumer = raw_consumer(kafka, self._names if subscribe else [], group_id, name, from_beginning)
        self._positions: dict[TopicPartition, int] = {}
        self._deadletters: EventProducer | None = None
        self.dead_lettered = 0

    async def __aenter__(self) -> EventConsumer:
        await self.consumer.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._deadletters is not None:
                await self._deadletters.__aexit__(exc_type, exc, tb)
        finally:
            await self.consumer.stop()

    async def batch(self, timeout_ms: int = 500, max_records: int = 5000) -> list[Consumed]:
        """The next records (up to `max_records`, waiting up to `timeout_ms`), decoded."""
        fetched = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        out: list[Consumed] = []
        bad: list[tuple[ConsumerRecord[bytes, bytes], str]] = []
        with collector_paused():
            for tp, records in fetched.items():
                short = self._short[tp.topic]
                for record in records:
                    try:
                        event = decode_event_fast(record.value)
                    except DecodeError as error:
                        bad.append((record, error.reason))
                    else:
                        out.append(Consumed(event, short, record.partition, record.offset))
                if records:
                    self._positions[tp] = records[-1].offset + 1
        for record, reason in bad:
            await self._dead_letter(record, reason)
        return out

    async def commit(self, offsets: dict[tuple[str, int], int] | None = None) -> None:
        """Commit (short topic, partition) -> next offset; None = everything consumed so far."""
        if self._group_id is None:
            raise BusError(f"consumer {self.name!r} has no group_id, so it cannot commit offsets")
        if self._deadletters is not None:
            await self._deadletters.flush()
        if offsets is None:
            assigned = self.consumer.assignment()  # after a rebalance, revoked partitions are not ours
            to_commit = {tp: offset for tp, offset in self._positions.items() if tp in assigned}
        else:
            to_commit = {
                TopicPartition(topic_name(self._topics, short), partition): offset
                for (short, partition), offset in offsets.items()
            }
        if to_commit:
            await self.consumer.commit(to_commit)

    async def _dead_letter(self, record: ConsumerRecord[bytes, bytes], reason: str) -> None:
        if self._deadletters is None:
            self._deadletters = await EventProducer(self._kafka, self._topics).__aenter__()
        event = dead_letter_event(record, reason, self.name)
        await self._deadletters.send("deadletter", event)
        self.dead_lettered += 1
        logger.warning("dead-lettered %s[%d]@%d: %s", record.topic, record.partition, record.offset, reason)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch decodes (no awaits inside).

    Decoding allocates hundreds of thousands of acyclic containers per batch (token
    lists, payload models); with the collector on, they trigger hundreds of young
    collections and repeated older-generation scans that can free nothing. Reference
    counting still frees everything at once; the collector resumes afterwards."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def dead_letter_event(record: ConsumerRecord[bytes, bytes], reason: str, consumer: str) -> Event:
    """The `deadletter.record` event for a record that could not be read."""
    return dead_letter(
        record.topic,
        record.partition,
        record.offset,
        record.key,
        record.value or b"",
        reason=reason,
        consumer=consumer,
    )


def dead_letter(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes,
    *,
    reason: str,
    consumer: str,
    group_id: str | None = None,
    time_ns: int | None = None,
) -> Event:
    """The `deadletter.record` event for the record at `topic` (full name) [`partition`] @ `offset`:
    one that could not be read, or a valid event that no consumer can act on (its `group_id`, when
    known, keeps the dead letter on its group's partition). The id depends on topic, partition and
    offset only, so dead-lettering the same record again after a restart writes the same event."""
    data = DeadLetterRecord(
        reason=reason,
        topic=topic,
        partition=partition,
        offset=offset,
        key_b64=base64.b64encode(key).decode() if key is not None else None,
        value_b64=base64.b64encode(value).decode(),
        consumer=consumer,
    )
    return make_event(
        data,
        run_id=_run_id_of(value),
        seq=offset,
        time_ns=time.time_ns() if time_ns is None else time_ns,
        source=consumer,
        group_id=group_id,
        id_key=f"deadletter:{topic}:{partition}",
    )


def _run_id_of(value: bytes) -> str:
    """The run id of a bad record when it still has one, else ''."""
    try:
        raw = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return ""
    run_id = raw.get("run_id") if isinstance(raw, dict) else None
    return run_id if isinstance(run_id, str) else ""


def raw_consumer(
    kafka: KafkaSettings, names: Sequence[str], group_id: str | None, name: str, from_beginning: bool
) -> AIOKafkaConsumer:
    """An aiokafka consumer of full topic `names` (none: assign by hand), client `<client_id>-<name>`,
    auto commit off; a missing or out-of-range offset resets to the earliest (`from_beginning`) or latest."""
    return AIOKafkaConsumer(
        *names,
        bootstrap_servers=kafka.bootstrap,
        client_id=f"{kafka.client_id}-{name}",
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest" if from_beginning else "latest",
        fetch_max_bytes=kafka.fetch_max_bytes,
        max_partition_fetch_bytes=kafka.max_partition_fetch_bytes,
        request_timeout_ms=kafka.request_timeout_ms,
    )


async def read_topic(
    kafka: KafkaSettings, topics: TopicSettings, short: str, *, idle_s: float = 1.0
) -> list[Consumed]:
    """Every decodable record of `short` from offset 0 to its end as of the call.

    Stops when every partition reached that end (see `_read_whole` for the stall bound).
    Undecodable records are skipped (the live consumers dead-letter them)."""
    out: list[Consumed] = []
    async for records in _read_whole(kafka, topics, short, idle_s):
        out.extend(_decoded(records, short))
    return out


async def read_topic_ids(
    kafka: KafkaSettings, topics: TopicSettings, short: str, *, idle_s: float = 1.0
) -> set[uuid.UUID]:
    """The ids of every record of `short`, read as `read_topic` reads, without decoding payloads
    (a record whose id is not where `encode_event` writes it is decoded; undecodable ones skipped)."""
    ids: set[uuid.UUID] = set()
    async for records in _read_whole(kafka, topics, short, idle_s):
        for record in records:
            value = record.value or b""
            match = _ID_PREFIX.match(value)
            if match:
                ids.add(uuid.UUID(match.group(1).decode()))
            else:
                with contextlib.suppress(DecodeError):  # not ours to judge: its consumers dead-letter it
                    ids.add(decode_event(value).id)
    return ids


async def read_topic_since(
    kafka: KafkaSettings,
    topics: TopicSettings,
    short: str,
    since_ms: int,
    *,
    marker: bytes = b"",
    idle_s: float = 1.0,
) -> list[Consumed]:
    """Every decodable record of `short` written at or after `since_ms` (record timestamps, ms since
    the epoch) up to its end as of the call; with `marker`, only records whose raw bytes contain it
    (a cheap filter before decoding)."""
    out: list[Consumed] = []
    async for records in _read_whole(kafka, topics, short, idle_s, since_ms=since_ms):
        out.extend(_decoded([r for r in records if marker in (r.value or b"")], short))
    return out


async def _read_whole(
    kafka: KafkaSettings, topics: TopicSettings, short: str, idle_s: float, *, since_ms: int | None = None
) -> AsyncIterator[list[ConsumerRecord[bytes, bytes]]]:
    """Batches of `short`'s records from offset 0 (or the first record at or after `since_ms`)
    until every partition reached its end as of the call. `idle_s` is how long one fetch waits;
    the read gives up early only when nothing arrived for the longer of `idle_s` and
    `kafka.request_timeout_ms` (a broker that stopped answering): on a loaded machine one fetch
    can take longer than `idle_s`, and stopping then returned a partial topic as if it were whole."""
    name = topic_name(topics, short)
    consumer = raw_consumer(kafka, [], None, f"read-{short}", True)
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(name) or await _partitions(consumer, name)
        tps = [TopicPartition(name, p) for p in sorted(partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        if since_ms is None:
            await consumer.seek_to_beginning(*tps)
        else:
            starts = await consumer.offsets_for_times({tp: since_ms for tp in tps})
            for tp in tps:
                found = starts.get(tp)
                consumer.seek(tp, found.offset if found is not None else ends[tp])
        stall_s = max(idle_s, kafka.request_timeout_ms / 1000)
        last_progress = time.monotonic()
        while await behind(consumer, ends):
            fetched = await consumer.getmany(*tps, timeout_ms=int(idle_s * 1000), max_records=10_000)
            if any(fetched.values()):
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress >= stall_s:
                break
            for records in fetched.values():
                yield records
    finally:
        await consumer.stop()


def _decoded(records: list[ConsumerRecord[bytes, bytes]], short: str) -> list[Consumed]:
    out = []
    for record in records:
        try:
            out.append(Consumed(decode_event_fast(record.value), short, record.partition, record.offset))
        except DecodeError:
            continue
    return out


async def behind(consumer: AIOKafkaConsumer, ends: dict[TopicPartition, int]) -> bool:
    """True while some partition has not reached its end offset."""
    for tp, end in ends.items():
        if await consumer.position(tp) < end:
            return True
    return False


async def _partitions(consumer: AIOKafkaConsumer, name: str) -> set[int]:
    await refresh_metadata(consumer)  # a fresh consumer may not know the topic yet
    found = consumer.partitions_for_topic(name)
    if not found:
        raise BusError(f"topic {name} does not exist; create it with `rollstream topics create`")
    return found
