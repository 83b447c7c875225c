"""The rollout worker in-process on real Kafka with simulated sandboxes and a scripted policy:
infrastructure errors re-run per policy and never scored, offsets committed only for finished
requests, and one process holding 1,000 episodes at once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from agents.chat import ChatFormat
from agents.episode import EpisodeServices, EpisodeSpec
from agents.finished_log import finished_since
from agents.identity import group_id, trajectory_id
from agents.rollout import RolloutWorker
from agents.scripted import ScriptedPolicy
from agents.submit import run_requests, submit_requests
from agents.worker_setup import TaskCatalog, WorkerSettings
from bench.rollout_sim import make_task_root
from rollstream.config import Config
from sandboxes.base import Sandbox
from sandboxes.pool import SandboxPool
from sandboxes.simulated import SimulatedLatency, SimulatedSandboxFactory
from sandboxes.tasks import Task, Verdict
from streams.bus import read_topic
from streams.outcomes import Outcome
from streams.payloads import Limits, TrajectoryFinished
from streams.topics import create_topics

SUBMIT = "```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


async def verify(box: Sandbox, task: Task) -> Verdict:
    return Verdict(1.0, {"test_sim": True}, {}, 0.0)


def services(
    config: Config, chat: ChatFormat, pool: SandboxPool, replies: list[str], delay_s: float
) -> EpisodeServices:
    return EpisodeServices(
        policy=ScriptedPolicy(chat, replies, delay_s=delay_s),
        sandboxes=pool,
        verifier=verify,
        chat=chat,
        agent=config.agent,
        backend="simulated",
        source="test-worker",
        command_timeout_s=10.0,
    )


async def serve_until(worker: RolloutWorker, done: Callable[[], bool], timeout: float = 120.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + timeout
    try:
        while not done():
            assert not task.done() or task.exception() is None, task.exception()
            assert time.monotonic() < deadline, "timed out waiting for the worker"
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await task


async def test_infra_errors_rerun_per_policy_never_scored_and_committed(
    kafka_config: Config, tmp_path: Path, chat: ChatFormat
) -> None:
    root = tmp_path / "tasks"
    task = make_task_root(root)
    failing = SimulatedSandboxFactory(SimulatedLatency(time_scale=0.001, start_failure_rate=1.0))
    requests = run_requests("run-i", [task], 1, Limits())
    await submit_requests(kafka_config.kafka, kafka_config.topics, requests)
    finished: list[tuple[EpisodeSpec, TrajectoryFinished]] = []
    config = kafka_config
    settings = WorkerSettings(config.kafka, config.topics, config.rollout, config.policy)
    async with SandboxPool(kafka_config.sandbox, failing) as pool:
        worker = RolloutWorker(
            settings,
            services(kafka_config, chat, pool, [SUBMIT], 0.0),
            TaskCatalog(root),
            on_finished=lambda spec, f: finished.append((spec, f)),
        )
        await serve_until(worker, lambda: len(finished) == 3)
        assert [spec.retry for spec, _ in finished] == [0, 1, 2]  # infra_error_retries = 2
        assert all(f.outcome == Outcome.INFRA_SANDBOX_START and f.reward is None for _, f in finished)
        group = group_id("run-i", task.task_id, 0)
        expected = [trajectory_id(group, 0, retry) for retry in range(3)]
        assert [spec.trajectory_id for spec, _ in finished] == expected
        requests = await read_topic(kafka_config.kafka, kafka_config.topics, "rollout.requests", idle_s=0.5)
        assert sorted(c.event.data.retry for c in requests) == [0, 1, 2]
        # everything finished was committed: a new worker in the same group has nothing to run
        again = RolloutWorker(
            settings,
            services(kafka_config, chat, pool, [SUBMIT], 0.0),
            TaskCatalog(root),
            on_finished=lambda spec, f: finished.append((spec, f)),
        )
        began = time.monotonic()
        await serve_until(again, lambda: time.monotonic() - began > 8.0)
    assert len(finished) == 3


async def test_one_process_holds_a_thousand_episodes(
    config_factory: Callable[..., Config], tmp_path: Path, chat: ChatFormat
) -> None:
    caps = ("rollout.concurrency=1000", "sandbox.pool.max_running=1000", "sandbox.pool.max_starting=1000")
    config = config_factory(*caps, create_topics=False)
    await create_topics(config.kafka, config.topics)
    root = tmp_path / "tasks"
    task = make_task_root(root)
    requests = run_requests("run-c", [task], 8, Limits(max_turns=2), groups_per_task=125)
    await submit_requests(config.kafka, config.topics, requests)
    settings = WorkerSettings(config.kafka, config.topics, config.rollout, config.policy)
    finished: list[TrajectoryFinished] = []
    peak = 0

    def all_done() -> bool:
        nonlocal peak
        peak = max(peak, worker.in_flight)
        return len(finished) == 1000

    # each episode lasts >= 20 s (two 10 s model calls), far longer than taking 1,000 requests
    factory = SimulatedSandboxFactory(SimulatedLatency(time_scale=0.5))
    async with SandboxPool(config.sandbox, factory) as pool:
        reply = "```bash\nls\n```"
        worker = RolloutWorker(
            settings,
            services(config, chat, pool, [reply], 10.0),
            TaskCatalog(root),
            on_finished=lambda spec, f: finished.append(f),
        )
        await serve_until(worker, all_done, timeout=240.0)
    assert peak == 1000
    assert all(f.outcome == Outcome.TRUNCATED_TURNS for f in finished)


async def test_two_workers_share_the_requests_without_running_one_twice(
    config_factory: Callable[..., Config], tmp_path: Path, chat: ChatFormat
) -> None:
    config = config_factory("rollout.concurrency=40", create_topics=False)
    await create_topics(config.kafka, config.topics)
    root = tmp_path / "tasks"
    task = make_task_root(root)
    requests = run_requests("run-2", [task], 8, Limits(max_turns=2), groups_per_task=40)
    await submit_requests(config.kafka, config.topics, requests)
    settings = WorkerSettings(config.kafka, config.topics, config.rollout, config.policy)
    done: dict[str, list[str]] = {"a": [], "b": []}
    factory = SimulatedSandboxFactory(SimulatedLatency(time_scale=0.2))
    async with SandboxPool(config.sandbox, factory) as pool:

        def worker(name: str) -> RolloutWorker:
            return RolloutWorker(
                settings,
                services(config, chat, pool, ["```bash\nls\n```"], 1.0),
                TaskCatalog(root),
                on_finished=lambda spec, f: done[name].append(spec.trajectory_id),
            )

        first = worker("a")
        second = worker("b")
        stop = asyncio.Event()
        running_a = asyncio.create_task(first.run(stop))
        await asyncio.sleep(3.0)  # the second joins mid-run: a rebalance moves partitions
        running_b = asyncio.create_task(second.run(stop))
        expected = {e.trajectory_id for e in requests}
        # Done means finished on the log: an episode cancelled by the rebalance while its
        # `trajectory.finished` was being acked is on the log without an `on_finished`, and
        # the partition's new owner skips its request as finished (`skipped_finished`).
        finished: dict[str, Outcome] = {}

        def settled() -> bool:  # every request finished on the log, and each one handled by a worker
            unreported = expected - set(done["a"]) - set(done["b"])
            skipped = first.skipped_finished + second.skipped_finished
            return expected <= finished.keys() and len(unreported) <= skipped

        deadline = time.monotonic() + 180
        while not settled():
            assert time.monotonic() < deadline, (
                f"timed out waiting for every request: {len(expected & finished.keys())} of "
                f"{len(expected)} finished on the log, in flight a={first.in_flight} b={second.in_flight}, "
                f"skipped a={first.skipped_finished} b={second.skipped_finished}, pool {pool.stats()}"
            )
            assert not running_a.done() and not running_b.done()
            await asyncio.sleep(0.5)
            finished = await finished_since(config.kafka, config.topics, 0)
        stop.set()
        await asyncio.gather(running_a, running_b)
    assert done["a"] and done["b"], "both workers took part"
    for name in ("a", "b"):  # a re-delivered request is not started again by the same worker
        assert len(done[name]) == len(set(done[name])), name
