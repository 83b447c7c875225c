"""The stream worker on the real broker: SIGKILL mid-stream, restart, exactly the expected groups once.

Also: the group deadline writes `RolloutAbort` on `rollout.control` and forms the group
without the straggler after the grace; malformed records go to `deadletter`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rollstream.config import Config
from streams import bus
from streams.app import StreamWorker
from streams.bus import EventProducer
from streams.eventgen import AttemptSpec, group_events, synthetic_run, trajectory_events
from streams.events import Event
from streams.outcomes import Outcome
from streams.payloads import RolloutAbort
from streams.processor import Emit, StreamProcessor
from streams.settings import PolicySettings

# `rollstream worker` alone, so the test does not depend on every other command importing
WORKER = [
    sys.executable,
    "-c",
    "import typer; from rollstream.commands.worker import command; typer.run(command)",
]


async def _produce(config: Config, events: list[Event], raw: list[bytes] = ()) -> None:  # type: ignore[assignment]
    async with EventProducer(config.kafka, config.topics) as producer:
        for event in events:
            await producer.send("rollout.events", event)
        for value in raw:
            await producer.send_raw("rollout.events", value, b"bad")
        await producer.flush()


async def _ids(config: Config, short: str) -> list:
    return [c.event.id for c in await bus.read_topic(config.kafka, config.topics, short, idle_s=0.5)]


def _poll(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(1.0)


def _start_worker(config: Config, log: Path, name: str) -> subprocess.Popen[bytes]:
    args = [
        *WORKER,
        "--name",
        name,
        "-s",
        f'kafka.bootstrap="{config.kafka.bootstrap}"',
        "-s",
        f'topics.prefix="{config.topics.prefix}"',
        "-s",
        "streams.commit_interval_s=0.2",
    ]
    return subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT, cwd=log.parent)


def test_sigkill_and_restart_give_every_group_exactly_once(
    config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    config = config_factory()
    events = sorted(synthetic_run("run-kill", groups=40, group_size=4, seed=11), key=lambda e: e.time_ns)
    processor = StreamProcessor(config.policy)
    expected = {
        o.event.id: o.event.data
        for e in events
        for o in processor.feed(e)
        if isinstance(o, Emit) and o.topic == "groups"
    }
    assert len(expected) == 40
    split = len(events) * 6 // 10
    asyncio.run(_produce(config, events[:split] + events[100:160], [b"not json at all"]))
    log = tmp_path / "worker.log"
    worker = _start_worker(config, log, "w-killed")
    try:
        _poll(lambda: len(asyncio.run(_ids(config, "groups"))) >= 8, 120, "groups before the kill")
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(30)
    asyncio.run(_produce(config, events[split:]))
    restarted = _start_worker(config, log, "w-restarted")
    try:
        _poll(lambda: len(set(asyncio.run(_ids(config, "groups")))) >= 40, 180, "all groups after restart")
        time.sleep(2.0)  # anything duplicated would land now
    finally:
        restarted.send_signal(signal.SIGTERM)
        assert restarted.wait(60) == 0, log.read_text()[-3000:]
    groups = asyncio.run(bus.read_topic(config.kafka, config.topics, "groups", idle_s=0.5))
    assert sorted(str(c.event.id) for c in groups) == sorted(str(i) for i in expected)
    assert {c.event.id: c.event.data for c in groups} == expected
    trajectories = asyncio.run(_ids(config, "trajectories"))
    assert len(set(trajectories)) == len({e.trajectory_id for e in events})
    dead = asyncio.run(bus.read_topic(config.kafka, config.topics, "deadletter", idle_s=0.5))
    assert any("not JSON" in c.event.data.reason for c in dead)  # type: ignore[attr-defined]


def test_two_workers_share_the_partitions_and_write_each_group_once(
    config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    config = config_factory()
    events = sorted(synthetic_run("run-two", groups=40, group_size=4, seed=12), key=lambda e: e.time_ns)
    half = len(events) // 2
    asyncio.run(_produce(config, events[:half]))
    log = tmp_path / "workers.log"
    first = _start_worker(config, log, "w-first")
    second = None
    try:
        _poll(lambda: len(asyncio.run(_ids(config, "groups"))) >= 5, 120, "groups from the first worker")
        second = _start_worker(config, log, "w-second")  # joins: the partitions are rebalanced
        _poll(
            lambda: "w-second: assigned partitions [" in log.read_text().replace("[]", ""), 120, "a rebalance"
        )
        asyncio.run(_produce(config, events[half:]))
        _poll(lambda: len(set(asyncio.run(_ids(config, "groups")))) >= 40, 180, "every group")
        time.sleep(2.0)
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.send_signal(signal.SIGTERM)
        assert first.wait(60) == 0 and (second is None or second.wait(60) == 0), log.read_text()[-3000:]
    groups = asyncio.run(bus.read_topic(config.kafka, config.topics, "groups", idle_s=0.5))
    assert len(groups) == len({c.event.id for c in groups}) == 40
    assert {c.event.source for c in groups} == {"w-first", "w-second"}


async def test_deadline_writes_aborts_then_forms_without_the_straggler(
    config_factory: Callable[..., Config],
) -> None:
    config = await asyncio.to_thread(config_factory)
    policy = PolicySettings(group_size=4, group_deadline_s=2.0, abort_grace_s=2.0)
    t0 = time.time_ns()
    specs = [
        AttemptSpec(
            a,
            0,
            2,
            Outcome.RESOLVED if a % 2 else Outcome.UNRESOLVED,
            float(a % 2),
            group_size=4,
            turn_s=0.01,
        )
        for a in range(3)
    ]
    straggler = trajectory_events("run-d", "run-d/g0", AttemptSpec(3, 0, 30, group_size=4), t0_ns=t0)[:6]
    await _produce(config, group_events("run-d", "run-d/g0", specs, t0_ns=t0) + straggler)
    worker = StreamWorker(config.kafka, config.topics, policy, config.streams, name="w-deadline")
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        deadline = time.monotonic() + 90
        while worker.stats.groups < 1:
            assert time.monotonic() < deadline and not task.done(), "no group after the deadline"
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        await task
    [abort] = await bus.read_topic(config.kafka, config.topics, "rollout.control", idle_s=0.5)
    assert isinstance(abort.event.data, RolloutAbort)
    assert (
        abort.event.data.trajectory_ids == ["run-d/g0/a3r0"] and abort.event.data.reason == "group_deadline"
    )
    [group] = await bus.read_topic(config.kafka, config.topics, "groups", idle_s=0.5)
    assert group.event.data.members == ["run-d/g0/a0r0", "run-d/g0/a1r0", "run-d/g0/a2r0"]  # type: ignore[attr-defined]
