"""Engines follow weight versions from the log, not from the trainer.

A `WeightsFollower` consumes the compacted `weights` topic for one run from the
start (so it sees the latest version at once) and then follows it. For each
engine it serves (a `WeightsTarget`) it decides with `version_to_load` which
published version to load next, verifies that version's directory against the
checksum in its `weights.published` event (`trainer.versions.verify_directory`)
and loads it:

- `EmbeddedTarget`: the in-process engine, `Engine.update_weights(path, version)`;
- `HttpTarget`: an SGLang-compatible server, POST /update_weights_from_disk with
  {"model_path", "weight_version": str(version)} (SGLang's `UpdateWeightFromDiskReqInput`);
  the served version is read from GET /get_model_info.

A version whose directory is missing or does not hash to its checksum is refused:
logged as an error and never loaded on any engine (a newer version supersedes it).
An engine that cannot be reached or fails to load is retried after `follow.retry_s`.
Requests in flight continue on the new weights; each token records its version.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import aiohttp
from aiohttp import web
from aiokafka.errors import KafkaError

from agents.engine.answers import parse_weight_version
from agents.engine.engine import Engine
from agents.engine.errors import EngineRefusal
from agents.settings import FollowSettings
from streams.bus import BusError, EventConsumer
from streams.events import Event
from streams.payloads import WeightsPublished
from streams.settings import KafkaSettings, TopicSettings
from trainer.versions import ChecksumMismatch, verify_directory

logger = logging.getLogger(__name__)


def version_to_load(served: int, available: Iterable[int], sync_every: int) -> int | None:
    """The version an engine serving `served` loads next, of the `available` (published, not
    refused) versions; None = keep serving `served`.

    The newest version above `served` that is a multiple of `sync_every`, so every engine
    serves the same versions whenever it started. Failing that, the newest version when it is
    `sync_every` or more ahead of `served`: an engine that joined late (a compacted topic keeps
    only the latest version) or whose due version was refused catches up instead of waiting."""
    if sync_every < 1:
        raise ValueError(f"sync_every must be >= 1, got {sync_every}")
    newer = [version for version in available if version > served]
    if not newer:
        return None
    due = [version for version in newer if version % sync_every == 0]
    if due:
        return max(due)
    newest = max(newer)
    return newest if newest - served >= sync_every else None


class WeightsLoadError(RuntimeError):
    """An engine could not be reached, or could not load a version; retried later."""


class WeightsTarget(Protocol):
    """One engine a follower keeps up to date."""

    name: str

    async def served_version(self) -> int: ...

    async def load(self, path: Path, version: int) -> None: ...


class EmbeddedTarget:
    """The in-process embedded engine: weights swap between two scheduler steps."""

    def __init__(self, engine: Engine, name: str = "embedded") -> None:
        self.engine = engine
        self.name = name

    async def served_version(self) -> int:
        return self.engine.weight_version

    async def load(self, path: Path, version: int) -> None:
        try:
            swapped = await asyncio.to_thread(self.engine.update_weights, path, version)
            await asyncio.wrap_future(swapped)
        except (OSError, ValueError, EngineRefusal) as error:
            raise WeightsLoadError(f"{self.name} could not load {path}: {error}") from error


class HttpTarget:
    """An SGLang-compatible server (SGLang itself, or `rollstream engine serve`)."""

    def __init__(self, url: str, http: aiohttp.ClientSession) -> None:
        self.name = url.rstrip("/")
        self._http = http

    async def served_version(self) -> int:
        info = await self._call("GET", "/get_model_info", None)
        return parse_weight_version(info.get("weight_version"))

    async def load(self, path: Path, version: int) -> None:
        body = {"model_path": str(path), "weight_version": str(version)}
        answer = await self._call("POST", "/update_weights_from_disk", body)
        if not answer.get("success"):
            raise WeightsLoadError(f"{self.name} refused {path}: {answer.get('message', answer)}")

    async def _call(self, method: str, route: str, body: dict[str, str] | None) -> dict[str, object]:
        try:
            async with self._http.request(method, self.name + route, json=body) as reply:
                if reply.status != 200:
                    raise WeightsLoadError(f"{self.name}{route}: HTTP {reply.status}: {await reply.text()}")
                answer = await reply.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            raise WeightsLoadError(f"{self.name}{route} failed: {error!r}") from error
        if not isinstance(answer, dict):
            raise WeightsLoadError(f"{self.name}{route} answered {answer!r}, not a JSON object")
        return answer


@contextlib.asynccontextmanager
async def http_targets(urls: Sequence[str], settings: FollowSettings) -> AsyncIterator[list[HttpTarget]]:
    """One `HttpTarget` per URL over one HTTP session (closed on exit)."""
    timeout = aiohttp.ClientTimeout(total=settings.load_timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        yield [HttpTarget(url, http) for url in urls]


class WeightsFollower:
    """Keeps `targets` on the run's published weight versions (see the module docstring)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topics: TopicSettings,
        run_id: str,
        targets: Sequence[WeightsTarget],
        *,
        sync_every: int,
        settings: FollowSettings,
    ) -> None:
        if not targets:
            raise ValueError("a weights follower needs at least one engine to update")
        self._kafka, self._topics, self.run_id = kafka, topics, run_id
        self.targets = list(targets)
        self.sync_every = sync_every
        self.settings = settings
        self.published: dict[int, WeightsPublished] = {}
        self.refused: dict[int, str] = {}  # version -> why
        self.loads: list[tuple[str, int]] = []  # (target, version), in load order
        self.served: dict[str, int] = {}  # target -> version, once known
        self.newest_seen = -1
        self._verified: set[int] = set()
        self._retry_at: dict[str, float] = {}

    async def run(self, stop: asyncio.Event) -> None:
        """Follow until `stop` is set."""
        name = f"weights-follow-{self.run_id}"
        consumer = EventConsumer(self._kafka, self._topics, ["weights"], group_id=None, name=name)
        async with consumer:
            while not stop.is_set():
                self.observe(consumed.event for consumed in await consumer.batch(self.settings.poll_ms))
                await self.sync()

    def observe(self, events: Iterable[Event]) -> None:
        """Record this run's `weights.published` events (other runs share the topic)."""
        for event in events:
            data = event.data
            if event.run_id != self.run_id or not isinstance(data, WeightsPublished):
                continue
            if self.published.get(data.version) != data:  # new, or republished: judge it afresh
                self.published[data.version] = data
                self.refused.pop(data.version, None)
                self._verified.discard(data.version)
            self.newest_seen = max(self.newest_seen, data.version)

    async def sync(self) -> None:
        """Bring every target that is not waiting for a retry to the version it is due."""
        now = time.monotonic()
        ready = [t for t in self.targets if self._retry_at.get(t.name, 0.0) <= now]
        await asyncio.gather(*(self._learn_served(target) for target in ready))
        ready = [target for target in ready if target.name in self.served]
        wanted = await self._verified_choices(ready)
        await asyncio.gather(*(self._load(t, wanted[t.name]) for t in ready if t.name in wanted))
        self._forget_superseded()

    def _available(self) -> list[int]:
        return [version for version in self.published if version not in self.refused]

    async def _verified_choices(self, targets: Sequence[WeightsTarget]) -> dict[str, int]:
        """Target -> version to load, every chosen version verified (a refusal makes them choose again)."""
        while True:
            wanted = {
                target.name: version
                for target in targets
                if (version := version_to_load(self.served[target.name], self._available(), self.sync_every))
                is not None
            }
            unverified = sorted(set(wanted.values()) - self._verified)
            if not unverified:
                return wanted
            for version in unverified:
                await self._verify(version)

    async def _verify(self, version: int) -> None:
        published = self.published[version]
        try:
            await asyncio.to_thread(verify_directory, Path(published.path), published.checksum)
        except (ChecksumMismatch, OSError) as error:
            self.refused[version] = str(error)
            logger.error(
                "REFUSED weight version %d of run %s (%s): %s; engines keep their weights until a newer "
                "version is published",
                version,
                self.run_id,
                published.path,
                error,
            )
        else:
            self._verified.add(version)

    async def _learn_served(self, target: WeightsTarget) -> None:
        if target.name in self.served:
            return
        try:
            self.served[target.name] = await target.served_version()
        except WeightsLoadError as error:
            self._retry_later(target, error)

    async def _load(self, target: WeightsTarget, version: int) -> None:
        path = Path(self.published[version].path)
        started = time.monotonic()
        try:
            await target.load(path, version)
        except WeightsLoadError as error:
            self._retry_later(target, error)
            return
        previous = self.served[target.name]
        self.served[target.name] = version
        self.loads.append((target.name, version))
        logger.info(
            "%s: weight version %d -> %d of run %s (%s) in %.2fs",
            target.name,
            previous,
            version,
            self.run_id,
            path,
            time.monotonic() - started,
        )

    def _retry_later(self, target: WeightsTarget, error: WeightsLoadError) -> None:
        self._retry_at[target.name] = time.monotonic() + self.settings.retry_s
        logger.error("%s; retrying in %.1fs", error, self.settings.retry_s)

    def _forget_superseded(self) -> None:
        """Drop versions below what every target serves: no target will load them."""
        if len(self.served) < len(self.targets):
            return
        floor = min(self.served.values())
        for version in [v for v in self.published if v < floor]:
            del self.published[version]
            self.refused.pop(version, None)
            self._verified.discard(version)


def follow_in_app(follower: WeightsFollower) -> Callable[[web.Application], AsyncIterator[None]]:
    """An aiohttp cleanup context running `follower` beside the server in its event loop."""

    async def context(_: web.Application) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(_follow_until_stopped(follower, stop), name="weights-follower")
        yield
        stop.set()
        task.cancel()  # it may be waiting on a swap the stopping engine will not make
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return context


async def _follow_until_stopped(follower: WeightsFollower, stop: asyncio.Event) -> None:
    """Inside a server, a lost broker must not end the follower unnoticed: reconnect (re-reading
    `weights` from the start is harmless) after `follow.retry_s`."""
    while not stop.is_set():
        try:
            await follower.run(stop)
        except (KafkaError, BusError, OSError) as error:
            retry_s = follower.settings.retry_s
            logger.error("the weights follower lost the broker: %r; reconnecting in %.1fs", error, retry_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), retry_s)
