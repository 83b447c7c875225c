"""`EventProducer`: idempotent, `acks=all`, compressed, and batched by us.

`send` appends the encoded event to an open record batch of its partition (the
key's murmur2 partition, as Kafka's default partitioner picks it, cached per key)
and returns at once; a batch goes to aiokafka when it is full, holds
`kafka.producer_batch_records` records, or has lingered `kafka.linger_ms`. Handing
aiokafka whole batches skips its per-record send path. The linger loop sleeps while no batch
is open, so an idle producer costs no wake-ups (a gateway or worker waiting on engines). `flush` waits until
everything sent is acked and raises the first delivery error; `send_and_wait`
returns once that event is acked. Records of one partition keep their send order. A partition
whose queue stays full (a broker slow to ack) makes `send` wait, up to `kafka.max_block_ms`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner

from streams.aiokafka_private import BatchBuilder
from streams.events import Event, encode_event
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import COMPACTED, topic_name

KEY_CACHE_SIZE = 100_000  # keys remembered per topic (partition counts never shrink)


class BusError(RuntimeError):
    """A record could not be delivered or the bus was misused; the message says why."""


@dataclass(eq=False)
class _OpenBatch:
    builder: BatchBuilder
    opened: float
    handed_over: asyncio.Event = field(default_factory=asyncio.Event)
    delivery: asyncio.Future[Any] | None = None  # set once aiokafka has the batch


class EventProducer:
    """Batched, idempotent producer of events (or raw bytes) to Rollstream topics."""

    def __init__(self, kafka: KafkaSettings, topics: TopicSettings) -> None:
        self._kafka = kafka
        self._topics = topics
        self._producer = AIOKafkaProducer(
            bootstrap_servers=kafka.bootstrap,
            client_id=kafka.client_id,
            acks="all",
            enable_idempotence=True,
            compression_type=None if kafka.compression == "none" else kafka.compression,
            linger_ms=kafka.linger_ms,
            max_batch_size=kafka.max_batch_size,
            max_request_size=kafka.max_request_size,
            request_timeout_ms=kafka.request_timeout_ms,
        )
        self._partitioner = DefaultPartitioner()
        self._names: dict[str, str] = {}
        self._partitions: dict[str, list[int]] = {}
        self._sticky: dict[str, int] = {}
        self._key_partitions: dict[str, dict[bytes, int]] = {}
        self._open: dict[tuple[str, int], _OpenBatch] = {}
        self._handing: set[_OpenBatch] = set()
        self._inflight: set[asyncio.Future[Any]] = set()
        self._error: BaseException | None = None
        self._linger_task: asyncio.Task[None] | None = None
        self._batch_opened = asyncio.Event()  # set while some batch is open (the linger loop's cue)

    async def __aenter__(self) -> EventProducer:
        await self._producer.start()
        self._linger_task = asyncio.create_task(self._linger_loop(), name="event-producer-linger")
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is None:
                await self.flush()
        finally:
            if self._linger_task is not None:
                self._linger_task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._linger_task
            await self._producer.stop()

    async def send(self, short_topic: str, event: Event) -> None:
        """Enqueue `event`; returns without waiting for the broker. Key: `event.key` (the
        group), or the run id on compacted topics (`weights`: latest record per run)."""
        await self.send_raw(short_topic, encode_event(event), _key(short_topic, event))

    async def send_and_wait(self, short_topic: str, event: Event) -> None:
        """Send `event` and return once the broker has acked it."""
        tp, batch = await self._append(short_topic, encode_event(event), _key(short_topic, event))
        if self._open.get(tp) is batch:
            await self._submit(tp)
        await batch.handed_over.wait()  # the linger loop may be handing it over right now
        if batch.delivery is not None:
            await asyncio.gather(batch.delivery, return_exceptions=True)
        self._raise_error()

    async def send_raw(self, short_topic: str, value: bytes, key: bytes | None = None) -> None:
        """Enqueue raw bytes (tests use it to write malformed records)."""
        await self._append(short_topic, value, key)

    async def flush(self) -> None:
        """Wait until every record sent so far is acked; raise the first delivery error."""
        for tp in list(self._open):
            await self._submit(tp)
        for batch in list(self._handing):  # being handed over by the linger loop
            await batch.handed_over.wait()
        if self._inflight:
            await asyncio.gather(*self._inflight, return_exceptions=True)
        self._raise_error()

    async def _append(
        self, short_topic: str, value: bytes, key: bytes | None
    ) -> tuple[tuple[str, int], _OpenBatch]:
        self._raise_error()
        if len(value) > self._kafka.max_request_size:
            raise MessageSizeTooLargeError(
                f"a {len(value)}-byte record for {short_topic} exceeds kafka.max_request_size "
                f"({self._kafka.max_request_size}); raise it (and topics.max_message_bytes)"
            )
        topic = self._names.get(short_topic) or self._names.setdefault(
            short_topic, topic_name(self._topics, short_topic)
        )
        tp = (topic, await self._partition(topic, key))
        batch = self._open.get(tp)
        if batch is None:
            batch = self._open[tp] = _OpenBatch(self._producer.create_batch(), time.monotonic())
            self._batch_opened.set()
        if batch.builder.append(timestamp=None, key=key, value=value) is None:
            await self._submit(tp)  # full: ship it and start another
            batch = self._open[tp] = _OpenBatch(self._producer.create_batch(), time.monotonic())
            self._batch_opened.set()
            if batch.builder.append(timestamp=None, key=key, value=value) is None:
                raise BusError(f"record of {len(value)} bytes does not fit an empty batch of {topic}")
        if batch.builder.record_count() >= self._kafka.producer_batch_records:
            await self._submit(tp)
        return tp, batch

    async def _partition(self, topic: str, key: bytes | None) -> int:
        partitions = self._partitions.get(topic)
        if partitions is None:
            found = await self._producer.partitions_for(topic)
            if not found:
                raise BusError(f"topic {topic} has no partitions; create it with `rollstream topics create`")
            partitions = self._partitions[topic] = sorted(found)
        if key is None:
            return self._sticky.setdefault(topic, partitions[0])
        cache = self._key_partitions.setdefault(topic, {})
        partition = cache.get(key)
        if partition is None:  # murmur2 is pure Python in aiokafka; a group's key repeats for all its events
            if len(cache) >= KEY_CACHE_SIZE:
                cache.clear()
            partition = cache[key] = int(self._partitioner(key, partitions, partitions))
        return partition

    async def _submit(self, tp: tuple[str, int]) -> None:
        """Hand the open batch of `tp` to aiokafka (waits while its queue for `tp` is full)."""
        batch = self._open.pop(tp, None)
        if batch is None:
            return
        topic, partition = tp
        if self._sticky.get(topic) == partition:  # keyless records move on to the next partition
            partitions = self._partitions[topic]
            self._sticky[topic] = partitions[(partitions.index(partition) + 1) % len(partitions)]
        self._handing.add(batch)
        try:
            if batch.builder.record_count():
                batch.delivery = await self._hand_over(batch.builder, topic, partition)
                self._inflight.add(batch.delivery)
                batch.delivery.add_done_callback(self._delivered)
        finally:
            self._handing.discard(batch)
            batch.handed_over.set()

    async def _hand_over(self, builder: BatchBuilder, topic: str, partition: int) -> asyncio.Future[Any]:
        """Give a batch to aiokafka, waiting up to `kafka.max_block_ms` for room in its queue.

        aiokafka gives up after `request_timeout_ms` (and counts the wait down faster than it
        passes), leaving the batch with us: a broker that is slow to ack on a loaded machine is
        back-pressure, not a failed delivery, so hand the same batch over again."""
        deadline = time.monotonic() + self._kafka.max_block_ms / 1000
        while True:
            try:
                return await self._producer.send_batch(builder, topic, partition=partition)
            except KafkaTimeoutError as error:
                if time.monotonic() >= deadline:
                    raise BusError(
                        f"{topic}[{partition}] had no room for {self._kafka.max_block_ms} ms: the broker "
                        f"is not acking (down or overloaded?); raise kafka.max_block_ms to wait longer"
                    ) from error

    def _delivered(self, future: asyncio.Future[Any]) -> None:
        self._inflight.discard(future)
        if not future.cancelled() and future.exception() is not None and self._error is None:
            self._error = future.exception()

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise BusError(f"delivery to Kafka failed: {error!r}") from error

    async def _linger_loop(self) -> None:
        linger_s = max(self._kafka.linger_ms, 1) / 1000
        while True:
            await self._batch_opened.wait()
            await asyncio.sleep(linger_s)
            now = time.monotonic()
            for tp, batch in list(self._open.items()):
                if now - batch.opened >= linger_s and self._open.get(tp) is batch:
                    try:
                        await self._submit(tp)
                    except Exception as error:  # surfaced by the next send or flush
                        self._error = self._error or error
            if not self._open:
                self._batch_opened.clear()


def _key(short_topic: str, event: Event) -> bytes | None:
    """Compacted topics keep the latest record per key, and the broker refuses keyless ones."""
    return event.run_id.encode() if short_topic in COMPACTED else event.key
