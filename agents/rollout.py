"""The rollout worker: requests in, episodes run, every event out through the bus.

One asyncio process consumes `rollout.requests` as a member of a consumer group
(several workers share the partitions) and runs up to `RolloutSettings.concurrency`
episodes at once, each an asyncio task (no per-episode threads), so one process
holds thousands of episodes that mostly wait on engines and sandboxes.

Delivery: every event goes to `rollout.events` keyed by group id (one partition
per group, in order); `trajectory.finished` is sent and acked before the
request counts as done, and a request's offset is committed only once it and
every request below it on its partition are done (`OffsetTracker`). A worker
killed with SIGKILL leaves its unfinished requests uncommitted: the next owner
of the partition re-runs them and, since ids derive from (trajectory id, seq),
writes the same event ids. Stopping (`stop` set: SIGTERM, Ctrl-C) drains: no
request is taken after it, in-flight episodes get `RolloutSettings.drain_timeout_s`
to finish (their `trajectory.finished` is written and their requests committed),
and those still running then are cancelled without writing more and left
uncommitted, to be re-run under the same ids.

A request no worker can serve (its task directory is missing or malformed, or the
record is not a rollout request with ids) goes to `deadletter` with the reason,
acked before its offset is committed, and the worker goes on.

Infrastructure errors end in `trajectory.finished` with `infra_error:*` (never
a reward); while `retry < PolicySettings.infra_error_retries` the worker writes a
new request for the same attempt with `retry + 1` (a new trajectory id) before
committing. Aborts on `rollout.control` (`AbortFollower`) end episodes now as
`truncated:deadline`; episodes start only once the worker has read every abort
written before it started.

Rebalances: before partitions move, finished requests are committed; episodes
of partitions that moved to another worker stop (writing nothing more) and are
re-run there; a request re-delivered to the worker already running or done
with it is not started again, nor is one whose trajectory finished on the log before
the partition was taken over (`agents.finished_log`).

Caveat: a re-run replays the episode with the same ids and per-turn seeds, but
an engine whose batching is not bitwise deterministic can sample differently,
so a consumer that keeps the first copy of each id can mix two runs of one
trajectory; the run that wrote `trajectory.finished` (its `source`) is whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable

from aiokafka import ConsumerRebalanceListener, TopicPartition

from agents.aborts import AbortFollower
from agents.episode import Episode, EpisodeServices, EpisodeSpec
from agents.event_sink import KafkaEventSink
from agents.finished_log import finished_since
from agents.offsets import OffsetTracker, Partition
from agents.scaffolds import new_episode
from agents.submit import TaskRef, request_event
from agents.worker_setup import TaskCatalog, WorkerSettings
from sandboxes.tasks import TaskFormatError
from streams.bus import Consumed, EventConsumer, EventProducer, dead_letter
from streams.events import Event, encode_event
from streams.outcomes import Outcome
from streams.payloads import RolloutRequested, TrajectoryFinished
from streams.topics import short_name, topic_name

log = logging.getLogger(__name__)

FinishedHook = Callable[[EpisodeSpec, TrajectoryFinished], None]


class RolloutWorkerError(RuntimeError):
    """An episode failed outside its own error handling (e.g. Kafka refused its events):
    the worker stops without committing it, so the request is re-run."""


class RolloutWorker:
    def __init__(
        self,
        settings: WorkerSettings,
        services: EpisodeServices,
        tasks: TaskCatalog,
        *,
        on_finished: FinishedHook | None = None,
    ) -> None:
        self.settings = settings
        self.services = services
        self.tasks = tasks
        self.on_finished = on_finished
        self.name = services.source
        self.offsets = OffsetTracker()
        self.episodes: dict[str, Episode] = {}
        self.outcomes: Counter[str] = Counter()
        self.retries_sent = 0
        self.finished: dict[str, Outcome] = {}  # trajectory id -> outcome, here or read from the log
        self.skipped_finished = 0  # requests not run again: their trajectory had finished
        self._unchecked: set[Partition] = set()  # taken over, finished trajectories not read yet
        self._owned: set[Partition] = set()
        self._partition_of: dict[asyncio.Task[None], Partition] = {}
        self._slot_freed = asyncio.Event()
        self.failure: BaseException | None = None
        self.aborts = AbortFollower(
            settings.kafka,
            settings.topics,
            name=f"{self.name}-control",
            on_abort=self._abort,
            poll_ms=settings.rollout.request_poll_ms,
        )
        self._sink: KafkaEventSink | None = None

    @property
    def in_flight(self) -> int:
        return len(self._partition_of)

    @property
    def events_written(self) -> int:
        return self._sink.events if self._sink is not None else 0

    async def run(self, stop: asyncio.Event) -> None:
        """Serve requests until `stop` is set."""
        s = self.settings
        requests = EventConsumer(
            s.kafka, s.topics, ["rollout.requests"], group_id=s.rollout.consumer_group, name=self.name
        )
        requests.consumer.subscribe(
            topics=[topic_name(s.topics, "rollout.requests")], listener=_Rebalance(self, requests)
        )
        async with EventProducer(s.kafka, s.topics) as producer, requests:
            self._sink = KafkaEventSink(producer)
            helpers = [
                asyncio.create_task(self.aborts.run(), name="rollout-aborts"),
                asyncio.create_task(self._commit_loop(requests), name="rollout-commit"),
            ]
            for helper in helpers:  # a helper that dies stops the worker, like a failed episode
                helper.add_done_callback(self._helper_done)
            try:
                await self._wait_for_aborts(helpers[0])
                await self._serve(requests, stop)
                await self._drain(requests)
            finally:
                await self._cancel(set(self._partition_of))
                await self._cancel(set(helpers))
                with contextlib.suppress(Exception):
                    await producer.flush()
                await self._commit(requests)

    def _helper_done(self, helper: asyncio.Task[None]) -> None:
        if helper.cancelled():
            return  # shutdown
        error = helper.exception() or RolloutWorkerError(f"{helper.get_name()} stopped")
        self.failure = self.failure or error
        self._slot_freed.set()

    async def _wait_for_aborts(self, follower: asyncio.Task[None]) -> None:
        """Start episodes only once aborts written before now are known (no race at start)."""
        caught_up = asyncio.create_task(self.aborts.caught_up.wait())
        await asyncio.wait({caught_up, follower}, timeout=60.0, return_when="FIRST_COMPLETED")
        caught_up.cancel()
        if follower.done():
            follower.result()  # raises the follower's error
            raise RolloutWorkerError("the rollout.control follower stopped")
        if not self.aborts.caught_up.is_set():
            raise RolloutWorkerError("could not read rollout.control within 60 s; is Kafka up?")

    async def _serve(self, requests: EventConsumer, stop: asyncio.Event) -> None:
        stopping = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set() and self.failure is None:
                free = self.settings.rollout.concurrency - len(self._partition_of)
                if free > 0:
                    requests.consumer.resume(*requests.consumer.paused())
                    poll_ms = self.settings.rollout.request_poll_ms
                    batch = await requests.batch(timeout_ms=poll_ms, max_records=free)
                else:
                    batch = await self._wait_for_slot(requests, stopping)
                await self._read_finished(batch)
                for consumed in batch:
                    if stop.is_set():
                        break  # stopped during the poll: what it fetched stays uncommitted for the next owner
                    if not self.offsets.seen((consumed.topic, consumed.partition), consumed.offset):
                        self._start(consumed)
        finally:
            stopping.cancel()
        self._raise_failure()

    async def _drain(self, requests: EventConsumer) -> None:
        """After `stop`: take no more requests and let in-flight episodes finish within
        `drain_timeout_s`. Finished requests are committed (commit loop, then the final commit);
        the episodes still running afterwards are cancelled by `run`, their requests uncommitted."""
        requests.consumer.pause(*requests.consumer.assignment())
        running = set(self._partition_of)
        if not running:
            return
        timeout_s = self.settings.rollout.drain_timeout_s
        log.info("stopping: %d episodes in flight get up to %.1f s to finish", len(running), timeout_s)
        if timeout_s > 0:
            await asyncio.wait(running, timeout=timeout_s)
        if self._partition_of:
            log.warning("%d episodes still running after the drain: left to re-run", len(self._partition_of))
        self._raise_failure()

    def _raise_failure(self) -> None:
        if self.failure is not None:
            message = f"an episode failed, stopping the worker: {self.failure!r}"
            raise RolloutWorkerError(message) from self.failure

    async def _wait_for_slot(self, requests: EventConsumer, stopping: asyncio.Task[bool]) -> list[Consumed]:
        """Full: wait until an episode ends; poll with partitions paused so the group keeps us."""
        self._slot_freed.clear()
        freed = asyncio.create_task(self._slot_freed.wait())
        keepalive_s = self.settings.rollout.keepalive_s
        await asyncio.wait({freed, stopping}, timeout=keepalive_s, return_when="FIRST_COMPLETED")
        freed.cancel()
        if self._slot_freed.is_set() or stopping.done():
            return []
        requests.consumer.pause(*requests.consumer.assignment())
        return await requests.batch(timeout_ms=0, max_records=1)  # non-empty only after a rebalance

    async def _read_finished(self, batch: list[Consumed]) -> None:
        """The first requests of partitions taken over: learn which trajectories finished since the
        oldest of them (`agents.finished_log`), so those are not run a second time."""
        handed = [c for c in batch if (c.topic, c.partition) in self._unchecked]
        if not handed:
            return
        self._unchecked -= {(c.topic, c.partition) for c in handed}
        lookback_ns = int(self.settings.rollout.finished_lookback_s * 1e9)
        since_ns = min(c.event.time_ns for c in handed) - lookback_ns
        found = await finished_since(self.settings.kafka, self.settings.topics, max(since_ns, 0))
        for trajectory_id, outcome in found.items():
            self.finished.setdefault(trajectory_id, outcome)

    def _start(self, consumed: Consumed) -> None:
        partition = (consumed.topic, consumed.partition)
        self.offsets.started(partition, consumed.offset)
        tid = consumed.event.trajectory_id
        if tid is not None and (tid in self.finished or tid in self.episodes):
            work = self._after_finish_again(consumed, self.finished.get(tid))
        else:
            work = self._handle(consumed)
        task = asyncio.create_task(work, name=f"episode-{tid}")
        self._partition_of[task] = partition

        def done(finished: asyncio.Task[None]) -> None:
            self._partition_of.pop(finished, None)
            if finished.cancelled():
                pass  # shutdown: left uncommitted, re-run by the partition's next owner
            elif finished.exception() is not None:  # e.g. Kafka refused the events: stop, never commit
                self.failure = self.failure or finished.exception()
            else:
                self.offsets.finished(partition, consumed.offset)
            self._slot_freed.set()

        task.add_done_callback(done)

    async def _handle(self, consumed: Consumed) -> None:
        event = consumed.event
        request = event.data
        if not isinstance(request, RolloutRequested) or not event.trajectory_id or not event.group_id:
            reason = f"{event.type} is not a rollout request with group and trajectory ids"
            await self._dead_letter(consumed, reason)
            return
        try:
            task = self.tasks.get(request.task_dir)
        except TaskFormatError as error:
            await self._dead_letter(consumed, f"the request's task cannot be loaded: {error}")
            return
        spec = EpisodeSpec(
            run_id=event.run_id,
            group_id=event.group_id,
            trajectory_id=event.trajectory_id,
            task=task,
            attempt=request.attempt,
            retry=request.retry,
            group_size=request.group_size,
            limits=request.limits,
        )
        finished = await self._run_episode(spec)
        self.finished[spec.trajectory_id] = finished.outcome
        self.outcomes[finished.outcome.value] += 1
        if self._retries(finished.outcome, request):
            await self._send_retry(event, request)
        if self.on_finished is not None:
            self.on_finished(spec, finished)

    async def _after_finish_again(self, consumed: Consumed, outcome: Outcome | None) -> None:
        """A request whose trajectory finished already (here, or on the log before a takeover) or
        runs here now (outcome None): not run again; its infra re-run request is written again,
        since the worker that finished it may have died before writing it (same event id)."""
        event, request = consumed.event, consumed.event.data
        self.skipped_finished += 1
        log.info("%s finished already (%s): not run again", event.trajectory_id, outcome or "running here")
        if outcome is not None and isinstance(request, RolloutRequested) and self._retries(outcome, request):
            await self._send_retry(event, request)

    def _retries(self, outcome: Outcome, request: RolloutRequested) -> bool:
        """Whether this outcome gets a re-run request: an infra error with retries left."""
        return outcome.is_infra_error and request.retry < self.settings.policy.infra_error_retries

    async def _dead_letter(self, consumed: Consumed, reason: str) -> None:
        """A request no worker can serve goes to `deadletter` (acked before its offset is committed)."""
        assert self._sink is not None
        log.error("dead-lettering %s[%d]@%d: %s", consumed.topic, consumed.partition, consumed.offset, reason)
        event = consumed.event
        record = dead_letter(
            topic_name(self.settings.topics, consumed.topic),
            consumed.partition,
            consumed.offset,
            event.key,
            encode_event(event),
            reason=reason,
            consumer=self.name,
        )
        await self._sink.send_acked("deadletter", record)

    async def _run_episode(self, spec: EpisodeSpec) -> TrajectoryFinished:
        assert self._sink is not None
        episode = new_episode(spec, self.services, self._sink)
        self.episodes[spec.trajectory_id] = episode
        reason = self.aborts.reason(spec.trajectory_id)
        if reason is not None:
            episode.abort(reason)
        try:
            return await episode.run()
        finally:
            self.episodes.pop(spec.trajectory_id, None)

    async def _send_retry(self, event: Event, request: RolloutRequested) -> None:
        assert self._sink is not None and event.group_id and event.task_id is not None
        retry = request_event(
            run_id=event.run_id,
            group=event.group_id,
            task=TaskRef(event.task_id, request.task_dir),
            attempt=request.attempt,
            retry=request.retry + 1,
            group_size=request.group_size,
            limits=request.limits,
            source=self.name,
        )
        await self._sink.send_acked("rollout.requests", retry)
        self.retries_sent += 1

    def _abort(self, trajectory_id: str, reason: str) -> None:
        episode = self.episodes.get(trajectory_id)
        if episode is not None:
            episode.abort(reason)

    async def _commit_loop(self, requests: EventConsumer) -> None:
        while True:
            await asyncio.sleep(self.settings.rollout.commit_interval_s)
            await self._commit(requests)

    async def _commit(self, requests: EventConsumer) -> None:
        positions = self.offsets.committable()
        if not positions:
            return
        try:
            await requests.commit(positions)
        except Exception as error:  # a rebalance took the partition: its new owner re-runs
            log.warning("commit of %s failed: %r", positions, error)
            owned = {(p.topic, p.partition) for p in requests.consumer.assignment()}
            topics = self.settings.topics
            self.offsets.forget({p for p in positions if (topic_name(topics, p[0]), p[1]) not in owned})
            return
        self.offsets.mark_committed(positions)

    def partitions_assigned(self, owned: set[Partition]) -> None:
        """After a rebalance: episodes of partitions now owned by another worker stop (writing
        nothing more); the new owner re-runs them from the committed offset."""
        self._unchecked = (self._unchecked & owned) | (owned - self._owned)
        self._owned = set(owned)
        lost = {p for p in self.offsets.partitions() | set(self._partition_of.values()) if p not in owned}
        for task, partition in list(self._partition_of.items()):
            if partition in lost:
                task.cancel()
        self.offsets.forget(lost)
        if lost:
            log.info("partitions %s moved to another worker; their episodes stop here", sorted(lost))

    @staticmethod
    async def _cancel(tasks: set[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class _Rebalance(ConsumerRebalanceListener):
    """Commits what is finished before partitions move; stops episodes of partitions lost."""

    def __init__(self, worker: RolloutWorker, requests: EventConsumer) -> None:
        self.worker = worker
        self.requests = requests

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        await self.worker._commit(self.requests)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        topics = self.worker.settings.topics
        self.worker.partitions_assigned({(short_name(topics, tp.topic), tp.partition) for tp in assigned})
