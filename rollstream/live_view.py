"""The live view of a run: a pure fold of its events (`RunView`), and the follower that feeds it.

    view = RunView(run_id, slots=cfg.rollout.concurrency * rollout_workers)
    view.apply(event)                    # pure: no Kafka, no clock; replays give the same view
    follower = RunFollower(cfg.kafka, cfg.topics, view, cfg.live, engine_urls, since_ns=start)
    await follower.run(stop)             # reads the run's topics, polls the engines' HTTP
    rollstream.live_render.render_run(view, supervisor.status())   # the rich renderable

The fold keeps, for one run (or every run with `run_id=None`): requests, trajectories
started and finished (by id, so a re-read event counts once), outcomes, groups kept
and dropped by reason, trainer steps (reward mean, grad norm, logprob difference,
ESS, what the trainer waited for: `trainer_waits`), published weight versions, and the
waits that say which concurrency cap binds:
a request waiting for a rollout slot (`rollout.requested` to `trajectory.started`),
a sandbox request waiting on each pool cap (`sandbox.ready` `cap_waits`: running,
starting, start_rate, image_pulls; a queue wait without them counts as `sandbox pool`),
and a turn waiting in an engine's queue (`turn.generated` queue wait). The engines' served
weight versions come from their HTTP (`/get_model_info`, `/engine_stats`), not the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from rollstream.live_settings import LiveViewSettings
from sandboxes.caps import CAP_NAMES
from streams.bus import EventConsumer
from streams.events import Event
from streams.payloads import (
    GroupFormed,
    SandboxFailed,
    SandboxReady,
    TrainerStep,
    TrajectoryFinished,
    TurnGenerated,
    WeightsPublished,
)
from streams.settings import KafkaSettings, TopicSettings
from streams.topics import partitions, topic_name
from trainer.waits import WaitSummary, mean_in_flight, summarise_waits

log = logging.getLogger(__name__)
FOLLOWED_TOPICS = ("rollout.requests", "rollout.events", "groups", "trainer.steps", "weights.history")
SANDBOX_CAPS = tuple(f"sandbox {cap}" for cap in CAP_NAMES)  # the pool's caps, from sandbox.ready
CAPS = ("rollout slots", *SANDBOX_CAPS, "sandbox pool", "engine queue")  # sandbox pool: no cap named


@dataclass(frozen=True)
class StepRow:
    step: int
    version: int
    reward_mean: float
    grad_norm: float
    logprob_diff: float
    ess: float
    groups: int
    trajectories: int
    total_s: float
    times: dict[str, float | None] = field(default_factory=dict)  # the step's StepTimes
    time_ns: int = 0  # when the step was written (after it published)

    def wait_window(self) -> tuple[int, int]:
        """When the trainer waited before this step (ns): the start of the step, for wait_s."""
        start = self.time_ns - int(self.total_s * 1e9)
        return start, start + int(float(self.times.get("wait_s") or 0.0) * 1e9)


@dataclass(frozen=True)
class EngineState:
    url: str
    weight_version: int | None  # None: not answering
    running: int = 0
    queued: int = 0
    error: str = ""


@dataclass
class CapWait:
    total_s: float = 0.0
    count: int = 0

    @property
    def mean_s(self) -> float:
        return self.total_s / self.count if self.count else 0.0


@dataclass
class RunView:
    run_id: str | None = None  # None: every run on the topics
    slots: int = 0  # episode slots of every rollout worker together (0 = unknown)
    requested: dict[str, int] = field(default_factory=dict)  # trajectory id -> request time (ns)
    started: dict[str, int] = field(default_factory=dict)  # trajectory id -> start time (ns)
    finished: dict[str, str] = field(default_factory=dict)  # trajectory id -> outcome
    finished_ns: dict[str, int] = field(default_factory=dict)  # trajectory id -> finish time (ns)
    groups: dict[str, str | None] = field(default_factory=dict)  # group id -> drop reason (None: kept)
    steps: dict[int, StepRow] = field(default_factory=dict)
    versions: dict[int, int] = field(default_factory=dict)  # published version -> step
    waits: dict[str, CapWait] = field(default_factory=lambda: {cap: CapWait() for cap in CAPS})
    engines: dict[str, EngineState] = field(default_factory=dict)
    events: int = 0
    _waited: set[str] = field(default_factory=set)  # trajectories whose slot wait is counted

    # ---- the fold ----
    def apply(self, event: Event) -> bool:
        """Fold one event in; False when it belongs to another run (ignored)."""
        if self.run_id is not None and event.run_id != self.run_id:
            return False
        self.events += 1
        tid, data = event.trajectory_id or "", event.data
        if event.type == "rollout.requested" and tid:
            self.requested.setdefault(tid, event.time_ns)
            self._slot_wait(tid)
        elif event.type == "trajectory.started" and tid:
            self.started.setdefault(tid, event.time_ns)
            self._slot_wait(tid)
        elif isinstance(data, TrajectoryFinished) and tid:
            self.finished[tid] = str(data.outcome)
            self.finished_ns.setdefault(tid, event.time_ns)
        elif isinstance(data, SandboxReady) and data.cap_waits:
            for cap, seconds in data.cap_waits.items():
                self._wait(f"sandbox {cap}" if f"sandbox {cap}" in self.waits else "sandbox pool", seconds)
        elif isinstance(data, SandboxReady | SandboxFailed):
            self._wait("sandbox pool", data.queue_wait_s)
        elif isinstance(data, TurnGenerated):
            self._wait("engine queue", data.queue_wait_s)
        elif isinstance(data, GroupFormed) and event.group_id:
            self.groups[event.group_id] = data.dropped
        elif isinstance(data, TrainerStep) and data.mode == "rl":
            self.steps[data.step] = StepRow(
                data.step,
                data.version,
                data.reward_mean,
                data.grad_norm,
                data.mean_logprob_diff,
                data.ess,
                data.groups,
                data.trajectories,
                data.times.total_s,
                data.times.model_dump(),
                event.time_ns,
            )
        elif isinstance(data, WeightsPublished):
            self.versions[data.version] = data.step
        return True

    def _wait(self, cap: str, seconds: float) -> None:
        wait = self.waits[cap]
        wait.total_s += max(seconds, 0.0)
        wait.count += 1

    def _slot_wait(self, tid: str) -> None:
        if tid in self._waited or tid not in self.requested or tid not in self.started:
            return
        self._waited.add(tid)
        self._wait("rollout slots", (self.started[tid] - self.requested[tid]) / 1e9)

    # ---- what the view shows ----
    @property
    def in_flight(self) -> int:
        return sum(1 for tid in self.started if tid not in self.finished)

    @property
    def queued(self) -> int:
        """Requests no worker has started yet."""
        return sum(1 for tid in self.requested if tid not in self.started)

    def outcomes(self) -> Counter[str]:
        return Counter(self.finished.values())

    @property
    def kept(self) -> int:
        return sum(1 for reason in self.groups.values() if reason is None)

    def dropped(self) -> Counter[str]:
        return Counter(reason for reason in self.groups.values() if reason is not None)

    def recent_steps(self, n: int) -> list[StepRow]:
        return [self.steps[k] for k in sorted(self.steps)[-n:]]

    def binding_cap(self) -> str | None:
        """The cap that cost the most waiting so far (None: nothing waited yet)."""
        cap, wait = max(self.waits.items(), key=lambda item: item[1].total_s)
        return cap if wait.total_s > 0 else None

    def slots_full(self) -> bool:
        return self.slots > 0 and self.in_flight >= self.slots

    def trainer_waits(self, last: int) -> WaitSummary:
        """The last `last` trainer steps' waits, with the rollouts in flight while they waited."""
        steps = self.recent_steps(last)
        spans = [(start, self.finished_ns.get(tid)) for tid, start in self.started.items()]
        in_flight = mean_in_flight(spans, [step.wait_window() for step in steps])
        return summarise_waits([step.times for step in steps], in_flight, self.slots or None)


# ---- the follower ----


class RunFollower:
    """Feeds a `RunView` from the run's topics and the engines' HTTP until `stop` is set."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        view: RunView,
        settings: LiveViewSettings,
        engine_urls: Sequence[str] = (),
        *,
        since_ns: int | None = None,
    ) -> None:
        """`since_ns`: read from the first record at or after this time (None: from the beginning)."""
        self.kafka, self.topics, self.view, self.settings = kafka, topics, view, settings
        self.engine_urls = list(engine_urls)
        self.since_ns = since_ns

    async def run(self, stop: asyncio.Event) -> None:
        engines = asyncio.create_task(self._poll_engines(stop))
        try:
            await self._follow(stop)
        finally:
            engines.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await engines

    async def _follow(self, stop: asyncio.Event) -> None:
        consumer = EventConsumer(
            self.kafka, self.topics, FOLLOWED_TOPICS, group_id=None, name="live-view", subscribe=False
        )
        async with consumer:
            attempts = self.settings.seek_attempts
            for attempt in range(attempts):
                try:
                    await self._seek(consumer)
                    break
                except KafkaError as error:  # a leader moving on a busy broker: try again
                    if attempt == attempts - 1:
                        raise
                    log.warning("live view: cannot seek the run's topics yet (%s); retrying", error)
                    await asyncio.sleep(1.0)
            while not stop.is_set():
                for item in await consumer.batch(timeout_ms=self.settings.poll_ms):
                    self.view.apply(item.event)

    async def _seek(self, consumer: EventConsumer) -> None:
        tps = [
            TopicPartition(topic_name(self.topics, short), p)
            for short in FOLLOWED_TOPICS
            for p in range(partitions(self.topics, short))
        ]
        raw = consumer.consumer
        raw.assign(tps)
        if self.since_ns is None:
            await raw.seek_to_beginning(*tps)
            return
        ends = await raw.end_offsets(tps)  # first: a record written meanwhile lies at or after them
        found = await raw.offsets_for_times({tp: self.since_ns // 1_000_000 for tp in tps})
        for tp in tps:
            at = found.get(tp)
            raw.seek(tp, at.offset if at is not None else ends[tp])

    async def _poll_engines(self, stop: asyncio.Event) -> None:
        if not self.engine_urls:
            return
        timeout = aiohttp.ClientTimeout(total=self.settings.engine_timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                states = await asyncio.gather(*(engine_state(session, url) for url in self.engine_urls))
                self.view.engines = {state.url: state for state in states}
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.engine_poll_s)


async def engine_state(session: aiohttp.ClientSession, url: str) -> EngineState:
    """What an engine serves: `weight_version` from /get_model_info (SGLang's contract), load from
    our /engine_stats when it has one (an SGLang server does not)."""
    try:
        async with session.get(f"{url}/get_model_info") as response:
            response.raise_for_status()
            info = await response.json()
        version = int(info.get("weight_version") or 0)
        running = queued = 0
        with contextlib.suppress(aiohttp.ClientError, ValueError):
            async with session.get(f"{url}/engine_stats") as response:
                if response.status == 200:
                    stats = await response.json()
                    running, queued = int(stats.get("running", 0)), int(stats.get("queued", 0))
        return EngineState(url, version, running, queued)
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        return EngineState(url, None, error=type(error).__name__)
