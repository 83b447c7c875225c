"""`KafkaEventSink`: episode events to `rollout.events`, a finished trajectory acked before it counts.

Used by the rollout worker and by evaluation, which run episodes the same way."""

from __future__ import annotations

import asyncio

from streams.bus import EventProducer
from streams.events import Event


class KafkaEventSink:
    """Episode events to `rollout.events`. `emit` of a `trajectory.finished` returns once the
    broker has acked it (events of one trajectory share a partition and are acked in order,
    so the earlier ones are acked by then).

    Acks are group-committed: one `flush` at a time, each covering every event sent before
    it started, so a thousand episodes finishing together cost a few flushes, not a thousand
    single-record batches queued on six partitions."""

    def __init__(self, producer: EventProducer) -> None:
        self.producer = producer
        self.events = 0
        self._sent = 0  # events enqueued so far
        self._acked = 0  # events known acked (every one enqueued before the last flush began)
        self._flushing = asyncio.Lock()

    async def emit(self, event: Event) -> None:
        await self.producer.send("rollout.events", event)
        self.events += 1
        self._sent += 1
        if event.type == "trajectory.finished":
            await self._wait_acked(self._sent)

    async def send_acked(self, short_topic: str, event: Event) -> None:
        """Any other record (a re-run request), returning once acked."""
        await self.producer.send(short_topic, event)
        self._sent += 1
        await self._wait_acked(self._sent)

    async def _wait_acked(self, position: int) -> None:
        async with self._flushing:
            if self._acked >= position:
                return  # a flush that began after this event was sent has covered it
            covered = self._sent
            await self.producer.flush()
            self._acked = covered
