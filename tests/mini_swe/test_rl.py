"""RL on mini-swe-agent groups, every process real: an engine following `weights`, a stream worker,
a rollout worker whose agent is mini-swe-agent (`agent.scaffold`), and the trainer.

Groups of mini-swe-agent attempts form, the trainer trains on them and publishes a version, the
engine loads it, and the next mini-swe-agent episode's tokens carry that version. The tiny random
model never resolves a task, so every group has zero reward variance: the test keeps such groups
(`policy.drop_zero_variance=false`) to show the path; their advantages are 0."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from agents.submit import run_requests, submit_requests, task_refs
from rollstream.config import Config
from rollstream.launcher.process import free_port
from rollstream.supervisor import Supervisor
from sandboxes.tasks.family import write_family
from streams.bus import read_topic
from streams.events import Event
from streams.payloads import GroupFormed, Limits, TrainerStep, TurnGenerated, WeightsPublished
from trainer.checkpoint import init_model_dir
from trainer.settings import ModelSettings

pytestmark = pytest.mark.slow
RUN = "mini-rl"
LIMITS = Limits(max_turns=2, max_new_tokens_per_turn=16, context_cap=8192)
SETTINGS = (
    'agent.scaffold="mini-swe-agent"',
    "policy.group_size=2",
    "policy.drop_zero_variance=false",
    "policy.max_staleness=-1",
    "trainer.groups_per_step=2",
    "trainer.torch_threads=1",
    "trainer.poll_ms=100",
    "engine.torch_threads=1",
    "rollout.concurrency=4",
    "rollout.commit_interval_s=0.2",
)


def wait_until(
    condition: Callable[[], bool], what: str, pipeline: Supervisor, timeout: float = 600.0
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        pipeline.check_alive()
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1.0)


def records(config: Config, short: str) -> list[Event]:
    consumed = asyncio.run(read_topic(config.kafka, config.topics, short, idle_s=0.5))
    return [c.event for c in consumed if c.event.run_id == RUN]


def served_version(url: str) -> str:
    try:
        return str(httpx.get(f"{url}/get_model_info", timeout=5).json()["weight_version"])
    except httpx.HTTPError:
        return ""


def test_rl_on_mini_swe_agent_groups_publishes_a_version_the_engine_follows(
    config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    config = config_factory(*SETTINGS)
    model = init_model_dir(ModelSettings(), tmp_path / "model")
    tasks = tmp_path / "tasks"
    write_family(tasks, "train", 2, seed=7)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sets = [
        f'kafka.bootstrap="{config.kafka.bootstrap}"',
        f'topics.prefix="{config.topics.prefix}"',
        f'run.state_dir="{config.run.state_dir}"',
        f'model.path="{model}"',
        *SETTINGS,
    ]
    with Supervisor(tmp_path / "logs", [a for s in sets for a in ("--set", s)], restart=False) as pipeline:
        engine = ["engine", "serve", "--model", str(model), "--port", str(port), "--context-length", "8192"]
        pipeline.start("engine", [*engine, "--follow-weights", RUN])
        pipeline.start("worker", ["worker"])
        pipeline.start("rollout", ["rollout", "--tasks", str(tasks), "--engine", url, "--model", str(model)])
        pipeline.start("trainer", ["train", "--run", RUN, "--steps", "1"], completes=True)
        requests = run_requests(RUN, task_refs(tasks), 2, LIMITS)
        asyncio.run(submit_requests(config.kafka, config.topics, requests))
        wait_until(lambda: served_version(url) == "1", "the engine to load version 1", pipeline)
        groups = {e.group_id: e.data for e in records(config, "groups") if isinstance(e.data, GroupFormed)}
        steps = [e.data for e in records(config, "trainer.steps") if isinstance(e.data, TrainerStep)]
        published = [
            e.data for e in records(config, "weights.history") if isinstance(e.data, WeightsPublished)
        ]
        later = run_requests(RUN, task_refs(tasks)[:1], 1, LIMITS, first_group=5)
        asyncio.run(submit_requests(config.kafka, config.topics, later))
        later_ids = {e.trajectory_id for e in later}
        wait_until(lambda: any(later_turns(config, later_ids)), "an episode on version 1", pipeline)
        wait_until(lambda: pipeline.done("trainer"), "the one-step trainer to exit 0", pipeline)
    assert len(groups) >= 2 and all(g.dropped is None and len(g.members) == 2 for g in groups.values())
    assert steps and steps[0].version == 1 and steps[0].trajectories == 4
    assert set(steps[0].group_ids) <= set(groups)  # it trained on the mini-swe-agent groups
    assert [w.version for w in published] == [1]
    assert all(t.weight_version == 1 for t in later_turns(config, later_ids))


def later_turns(config: Config, ids: set[str | None]) -> list[TurnGenerated]:
    consumed = asyncio.run(read_topic(config.kafka, config.topics, "rollout.events", idle_s=0.5))
    return [
        c.event.data
        for c in consumed
        if c.event.trajectory_id in ids and isinstance(c.event.data, TurnGenerated)
    ]
