"""Scale out: the same run on the three-broker cluster with one stream worker and one rollout
worker, and with two of each (separate processes, as on separate machines, sharing the
partitions through their consumer groups), gives the same trajectories (ids, outcomes,
rewards, token ids) and the same groups (ids, members, rewards, advantages), with no
trajectory lost or finished twice. The rollouts use the learning family's scripted expert
(`rollstream rollout --policy expert`), whose choices are seeded by trajectory id, so the
two runs are comparable record by record (the engine is not in this loop; `bench chaos`
runs the engine, and kills it)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from agents.submit import limits_of, run_requests, submit_requests, task_refs
from bench.chaos_counts import Finish, count_trajectories
from bench.learning import isolated
from rollstream.config import Config, load_config
from rollstream.launcher import kafka
from rollstream.learning import LEARNING_DEFAULTS, LearningPaths, prepare
from rollstream.run_progress import wait_for_groups
from rollstream.supervisor import Supervisor
from streams.bus import read_topic
from streams.payloads import GroupFormed, TrajectoryAssembled, TrajectoryFinished

pytestmark = pytest.mark.timeout(600)
BROKERS = 3
TASKS = 6
GROUP = 4
RUN = "scale-out"


@pytest.fixture(scope="module")
def cluster(base_config: Config) -> Iterator[Config]:
    kafka.ensure_up(base_config, BROKERS)
    try:
        yield base_config
    finally:
        kafka.down(base_config, BROKERS, wipe=True)


def overrides(cluster: Config, state: Path, name: str) -> list[str]:
    return [
        *LEARNING_DEFAULTS,
        *kafka.cluster_overrides(cluster, BROKERS),
        *isolated(name),
        f'run.state_dir="{state}"',
        f"policy.group_size={GROUP}",
        f"learning.train_tasks={TASKS}",
        "learning.heldout_tasks=1",
        "learning.seed=3",
        "rollout.concurrency=8",
        "sandbox.pool.warm_pool=0",
        "topics.rollout_requests_partitions=4",
        "topics.rollout_events_partitions=4",
        "topics.trajectories_partitions=2",
        "topics.groups_partitions=2",
    ]


def run_topology(cluster: Config, state: Path, workers: int, logs: Path) -> dict[str, dict]:
    """The run with `workers` stream workers and `workers` rollout workers; what its topics hold."""
    sets = overrides(cluster, state, f"so{workers}-{uuid.uuid4().hex[:6]}")
    cfg = load_config(None, sets)
    paths: LearningPaths = prepare(cfg)  # creates the topics; tasks and model are kept across runs
    config_args = [arg for item in sets for arg in ("--set", item)]
    requests = run_requests(RUN, task_refs(paths.train_tasks), GROUP, limits_of(cfg.policy))
    with Supervisor(logs / f"x{workers}", config_args, cfg.supervisor) as pipeline:
        for i in range(workers):
            pipeline.start(f"worker-{i}", ["worker", "--name", f"worker-{i}"])
            rollout = [
                "rollout",
                "--policy",
                "expert",
                "--tasks",
                str(paths.train_tasks),
                "--model",
                str(paths.base_model),
            ]
            pipeline.start(f"rollout-{i}", rollout)
        for group in (cfg.streams.group_id, cfg.rollout.consumer_group):
            asyncio.run(wait_for_members(cfg, group, workers))  # each worker owns partitions first
        asyncio.run(submit_requests(cfg.kafka, cfg.topics, requests))
        asyncio.run(wait_for_groups(cfg, RUN, TASKS, pipeline, 400.0))
    return asyncio.run(read_run(cfg, [str(r.trajectory_id) for r in requests]))


async def wait_for_members(cfg: Config, group: str, members: int, timeout_s: float = 120.0) -> None:
    """Until consumer group `group` is stable with `members` members."""
    admin = AIOKafkaAdminClient(bootstrap_servers=cfg.kafka.bootstrap)
    await admin.start()
    try:
        deadline, described = time.monotonic() + timeout_s, []
        while time.monotonic() < deadline:
            try:
                described = [g for r in await admin.describe_consumer_groups([group]) for g in r.groups]
            except KafkaError:  # a fresh cluster has no coordinator until the offsets topic exists
                described = []
            if described and described[0][2] == "Stable" and len(described[0][5]) == members:
                return
            await asyncio.sleep(0.5)
        raise AssertionError(f"consumer group {group} never had {members} stable members: {described}")
    finally:
        await admin.close()


async def read_run(cfg: Config, requested: list[str]) -> dict[str, dict]:
    events = [c.event for c in await read_topic(cfg.kafka, cfg.topics, "rollout.events", idle_s=2.0)]
    finishes = [
        Finish(e.trajectory_id or "", str(e.id), str(e.data.outcome), e.data.reward, e.data.injected)
        for e in events
        if isinstance(e.data, TrajectoryFinished)
    ]
    counts = count_trajectories(requested, finishes)
    trajectories, groups = {}, {}
    rollout_sources = {e.source for e in events if isinstance(e.data, TrajectoryFinished)}
    stream_sources = set()
    for item in await read_topic(cfg.kafka, cfg.topics, "trajectories", idle_s=2.0):
        stream_sources.add(item.event.source)
        data = item.event.data
        assert isinstance(data, TrajectoryAssembled)
        record = (str(data.outcome), data.reward, list(data.token_ids), list(data.loss_mask))
        assert trajectories.setdefault(item.event.trajectory_id, record) == record
    for item in await read_topic(cfg.kafka, cfg.topics, "groups", idle_s=2.0):
        data = item.event.data
        assert isinstance(data, GroupFormed)
        record = (data.members, data.rewards, data.advantages, data.dropped)
        assert groups.setdefault(item.event.group_id, record) == record
    return {
        "counts": {"lost": counts.lost, "duplicated": counts.duplicated, "finished": counts.finished},
        "trajectories": trajectories,
        "groups": groups,
        "workers": (len(rollout_sources), len(stream_sources)),
    }


def test_two_of_every_worker_give_the_same_trajectories_and_groups(cluster: Config, tmp_path: Path) -> None:
    state = tmp_path / ".rollstream"
    one = run_topology(cluster, state, 1, tmp_path / "logs")
    two = run_topology(cluster, state, 2, tmp_path / "logs")
    expected = TASKS * GROUP
    assert one["counts"] == two["counts"] == {"lost": 0, "duplicated": 0, "finished": expected}
    assert len(one["groups"]) == TASKS and len(one["trajectories"]) == expected
    assert one["trajectories"] == two["trajectories"]
    assert one["groups"] == two["groups"]
    rewards = {r for record in one["groups"].values() for r in record[1]}
    assert len(rewards) > 1, "the expert should both resolve and fail some tasks"
    assert one["workers"] == (1, 1)
    assert two["workers"] == (2, 2), "both rollout workers and both stream workers took part"
