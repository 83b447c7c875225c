"""Following `rollout.control`: which trajectories must stop now (group deadlines).

Every rollout worker reads the whole control topic (no consumer group, from the
beginning), so an abort written before a worker started, or before it picked up
the request, still applies: an episode that starts after its abort ends at once
as `truncated:deadline`. `on_abort` is called for each newly aborted trajectory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from streams.bus import Consumed, EventConsumer
from streams.events import Event
from streams.payloads import RolloutAbort
from streams.settings import KafkaSettings, TopicSettings

log = logging.getLogger(__name__)


class AbortFollower:
    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        *,
        name: str,
        on_abort: Callable[[str, str], None],
        poll_ms: int = 200,
    ) -> None:
        self.kafka = kafka
        self.topics = topics
        self.name = name
        self.on_abort = on_abort
        self.poll_ms = poll_ms
        self.reasons: dict[str, str] = {}
        self.caught_up = asyncio.Event()

    def reason(self, trajectory_id: str) -> str | None:
        """Why `trajectory_id` was aborted, or None."""
        return self.reasons.get(trajectory_id)

    def apply(self, event: Event) -> list[str]:
        """Record an abort event; the trajectory ids it newly aborts."""
        if not isinstance(event.data, RolloutAbort):
            return []
        fresh = [t for t in event.data.trajectory_ids if t not in self.reasons]
        for trajectory in fresh:
            self.reasons[trajectory] = event.data.reason
        return fresh

    async def run(self) -> None:
        """Follow the topic until cancelled; `caught_up` is set once every abort written
        before the start has been applied."""
        consumer = EventConsumer(
            self.kafka, self.topics, ["rollout.control"], group_id=None, name=self.name, from_beginning=True
        )
        async with consumer:
            await self._catch_up(consumer)
            self.caught_up.set()
            while True:
                self._apply_all(await consumer.batch(timeout_ms=self.poll_ms))

    async def _catch_up(self, consumer: EventConsumer) -> None:
        raw = consumer.consumer
        while not raw.assignment():
            self._apply_all(await consumer.batch(timeout_ms=100))
        ends = await raw.end_offsets(list(raw.assignment()))
        while any([await raw.position(tp) < end for tp, end in ends.items()]):
            self._apply_all(await consumer.batch(timeout_ms=self.poll_ms))

    def _apply_all(self, batch: list[Consumed]) -> None:
        for consumed in batch:
            for trajectory in self.apply(consumed.event):
                log.info("abort %s: %s", trajectory, self.reasons[trajectory])
                self.on_abort(trajectory, self.reasons[trajectory])
