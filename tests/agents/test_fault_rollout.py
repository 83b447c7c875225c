"""A rollout with injected faults, end to end on real components: the rollout worker on real Kafka,
real bubblewrap sandboxes with `sandbox.faults`, the real engine client with `client.faults`
against the real embedded engine, the real verifier. Every injected fault is recorded as an
`infra_error:*` marked injected (as many as the wrappers counted), re-run per policy, and none
reaches a reward or a GRPO group."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.chat import ChatFormat
from agents.engine.faults import FaultyEngineClient, make_client
from agents.episode import EpisodeSpec
from agents.rollout import RolloutWorker
from agents.submit import TaskRef, run_requests, submit_requests
from agents.worker_setup import TaskCatalog, WorkerSettings
from rollstream.config import Config
from rollstream.rollout_services import episode_services
from sandboxes.backends import make_factory
from sandboxes.faults import FaultySandboxFactory
from sandboxes.pool import SandboxPool
from sandboxes.tasks import Task, TaskMetadata
from sandboxes.tasks.harbor import write_task_files
from streams.assemble import Trajectory, fold_trajectory
from streams.bus import read_topic
from streams.events import Event
from streams.groups import form_group
from streams.payloads import Limits, TrajectoryFinished
from streams.topics import create_topics
from tests.engine.conftest import EngineFactory, make_engine, model_dir  # noqa: F401 (fixtures)
from tests.engine.test_server import serving

pytestmark = pytest.mark.timeout(300)
GROUP = 4
FAULTS = (
    "sandbox.faults.start_failure_rate=0.4",
    "sandbox.faults.seed=3",
    "client.faults.engine_error_rate=0.4",
    "client.faults.seed=3",
    "client.retries=0",
    "rollout.concurrency=2",
    f"policy.group_size={GROUP}",
)


def write_task(root: Path) -> TaskRef:
    """A task whose verifier always runs and scores 0 (the model is random: nothing resolves)."""
    task = Task("fault-task", root / "fault-task", "Fix the bug.", None, TaskMetadata(("test_x",)))
    test_sh = '#!/bin/bash\necho 0 > "$LOGS_DIR/reward.txt"\n'
    write_task_files(task.dir, task, test_sh=test_sh, solve_sh="#!/bin/bash\ntrue\n")
    (task.dir / "environment" / "repo").mkdir(parents=True, exist_ok=True)
    (task.dir / "environment" / "repo" / "README.md").write_text("fault task\n")
    return TaskRef(task.id, task.id)


def settled(finished: list[tuple[EpisodeSpec, TrajectoryFinished]], retries: int) -> bool:
    """Every attempt ended scored or used up its infra-error re-runs."""
    last: dict[int, tuple[int, TrajectoryFinished]] = {}
    for spec, f in sorted(finished, key=lambda item: item[0].retry):
        last[spec.attempt] = (spec.retry, f)
    return len(last) == GROUP and all(
        not f.outcome.is_infra_error or retry == retries for retry, f in last.values()
    )


async def serve_until(worker: RolloutWorker, done: Callable[[], bool], timeout: float = 240.0) -> None:
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


async def test_injected_faults_are_recorded_as_injected_infra_errors_and_never_scored(
    config_factory: Callable[..., Config],
    make_engine: EngineFactory,  # noqa: F811 (the fixture imported above)
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    config = config_factory(*FAULTS, create_topics=False)
    await create_topics(config.kafka, config.topics)
    chat = ChatFormat.from_model_dir(model_dir)
    root = tmp_path / "tasks"
    ref = write_task(root)
    limits = Limits(max_turns=2, max_new_tokens_per_turn=8)
    await submit_requests(config.kafka, config.topics, run_requests("run-f", [ref], GROUP, limits))
    finished: list[tuple[EpisodeSpec, TrajectoryFinished]] = []
    factory = make_factory(config.sandbox)
    assert isinstance(factory, FaultySandboxFactory)
    async with serving(make_engine()) as url:
        client_settings = config.client.model_copy(update={"urls": (url,)})
        async with make_client(client_settings) as client, SandboxPool(config.sandbox, factory) as pool:
            assert isinstance(client, FaultyEngineClient)
            worker = RolloutWorker(
                WorkerSettings(config.kafka, config.topics, config.rollout, config.policy),
                episode_services(config, client, pool, chat),
                TaskCatalog(root),
                on_finished=lambda spec, f: finished.append((spec, f)),
            )
            await serve_until(worker, lambda: settled(finished, config.policy.infra_error_retries))
    records = await read_topic(config.kafka, config.topics, "rollout.events", idle_s=0.5)
    events: dict[str, list[Event]] = defaultdict(list)
    for record in records:
        events[record.event.trajectory_id].append(record.event)
    ends = {tid: evs[-1].data for tid, evs in events.items() if evs[-1].type == "trajectory.finished"}
    assert len(ends) == len(finished)

    injected = {tid for tid, end in ends.items() if end.injected}
    assert injected and len(injected) < len(ends)  # the seeds give both kinds of trajectory
    assert all(ends[tid].outcome.is_infra_error and ends[tid].reward is None for tid in injected)
    assert not [tid for tid, end in ends.items() if end.outcome.is_infra_error and tid not in injected]
    by_outcome = defaultdict(int)
    for tid in injected:
        by_outcome[ends[tid].outcome.value] += 1
    sandbox_failed = [e.data for evs in events.values() for e in evs if e.type == "sandbox.failed"]
    assert all(f.injected for f in sandbox_failed)
    # what was injected, counted against what was recorded
    assert by_outcome["infra_error:sandbox_start"] == len(sandbox_failed) == factory.injected["start_failure"]
    assert (
        by_outcome["infra_error:engine"]
        == client.injected["request_failed"]
        == client.injected["engine_error"]
    )
    assert sum(by_outcome.values()) == len(injected)
    assert factory.injected["start_failure"] > 0 and client.injected["engine_error"] > 0

    trajectories = [fold_trajectory(evs) for evs in events.values()]
    assert all(isinstance(t, Trajectory) for t in trajectories)
    group = form_group(trajectories, config.policy, 0)  # type: ignore[arg-type]
    assert group.infra_errors == len(injected)
    assert not {m.trajectory_id for m in group.members} & injected  # no injected fault reaches a reward
    assert {m.trajectory_id for m in group.members} == set(ends) - injected
