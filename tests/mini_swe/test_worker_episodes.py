"""Real mini-swe-agent episodes in a rollout worker on real Kafka: learning-family tasks, bwrap
sandboxes, the embedded engine serving the tiny default model through the gateway.

Requests come from `rollout.requests` like any others; the trajectories on `rollout.events` fold,
their every generated token is the engine's (each turn's context, rebuilt from the events, sent to
the engine again with the turn's seed gives the same tokens), and the SQL store and replay see
them like any others.

The tiny model writes no tool calls, so mini-swe-agent answers each reply with a format error, and
it drops the rejected reply from its history: every later call is a `dropped` drift at that
reply, re-rendered and recorded (mini-swe-agent edits its history; the gateway does not care why)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.chat import ChatFormat
from agents.engine.engine import Engine
from agents.engine.protocol import SamplingParams
from agents.engine.server import create_app
from agents.episode import EpisodeSpec
from agents.identity import sampling_seed
from agents.rollout import RolloutWorker
from agents.submit import run_requests, submit_requests, task_refs
from agents.worker_setup import TaskCatalog, WorkerSettings
from rollstream.config import Config
from sandboxes.tasks.family import write_family
from streams.assemble import Trajectory, fold_trajectory
from streams.bus import read_topic
from streams.events import Event
from streams.payloads import Limits, TrajectoryFinished, TurnGenerated
from streams.replay import by_trajectory, load_from_db, replay
from streams.sink import Sink
from streams.store import open_store
from streams.topics import create_topics
from tests.gateway.conftest import engine_client, serve
from tests.mini_swe.conftest import MINI_AGENT, mini_services

pytestmark = pytest.mark.slow
LIMITS = Limits(max_turns=3, max_new_tokens_per_turn=24, context_cap=8192)


async def test_mini_swe_agent_episodes_through_the_worker_are_the_engines_tokens_in_sql_and_replay(
    config_factory: Callable[..., Config], model_dir: Path, chat: ChatFormat, tmp_path: Path, sqlite_url: str
) -> None:
    config = config_factory("rollout.concurrency=4", create_topics=False)
    await create_topics(config.kafka, config.topics)
    root = tmp_path / "tasks"
    write_family(root, "train", 2, seed=5)
    requests = run_requests("mini-run", task_refs(root), 2, LIMITS)
    await submit_requests(config.kafka, config.topics, requests)
    engine = Engine(model_dir, config.engine.model_copy(update={"context_length": 8192, "torch_threads": 1}))
    engine.start()
    finished: list[tuple[EpisodeSpec, TrajectoryFinished]] = []
    try:
        async with serve(create_app(engine)) as url, mini_services(config, chat, url, MINI_AGENT) as services:
            settings = WorkerSettings(config.kafka, config.topics, config.rollout, config.policy)
            worker = RolloutWorker(
                settings, services, TaskCatalog(root), on_finished=lambda s, f: finished.append((s, f))
            )
            await run_until(worker, lambda: len(finished) == 4)
            events = await read_events(config)
            await check_tokens_are_the_engines(url, events, chat)
    finally:
        engine.stop()
    trajectories = {tid: fold(episode) for tid, episode in events.items()}
    assert len(trajectories) == 4
    assert all(not f.outcome.is_infra_error for _, f in finished), [f.error for _, f in finished]
    assert all(t.turns >= 1 for t in trajectories.values())
    store = open_store(sqlite_url)
    await Sink(config.kafka, config.topics, config.db, store).run(until_idle_s=2)
    with store.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT trajectory_id, outcome, turns FROM trajectories WHERE run_id = 'mini-run'"
        ).fetchall()
        scaffolds = conn.exec_driver_sql(
            "SELECT count(*) FROM events WHERE type = 'trajectory.started' AND data LIKE '%mini-swe-agent%'"
        ).scalar()
    assert {r[0]: (r[1], r[2]) for r in rows} == {
        tid: (t.outcome.value, t.turns) for tid, t in trajectories.items()
    }
    assert scaffolds == 4
    replayed = replay(load_from_db(sqlite_url, "mini-run"), config.policy)
    assert len(replayed.folded) == 4
    for trajectory in replayed.folded:
        assert list(trajectory.token_ids) == list(trajectories[trajectory.trajectory_id].token_ids)


async def run_until(worker: RolloutWorker, done: Callable[[], bool], timeout: float = 600.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + timeout
    try:
        while not done():
            assert not task.done() or task.exception() is None, task.exception()
            assert time.monotonic() < deadline, "timed out waiting for the mini-swe-agent episodes"
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        await task


async def read_events(config: Config) -> dict[str, list[Event]]:
    consumed = await read_topic(config.kafka, config.topics, "rollout.events", idle_s=1.0)
    return by_trajectory([c.event for c in consumed])


def fold(events: list[Event]) -> Trajectory:
    folded = fold_trajectory(events)
    assert isinstance(folded, Trajectory), folded
    for turn in (e.data for e in events if isinstance(e.data, TurnGenerated)):
        assert turn.drift is None or turn.drift.reason == "dropped"  # a format error's reply left the history
    assert folded.history_drifts == sum(
        1 for e in events if isinstance(e.data, TurnGenerated) and e.data.drift
    )
    return folded


def contexts(events: list[Event]) -> list[tuple[TurnGenerated, list[int]]]:
    """Each turn with the context the engine was sent for it, rebuilt from the events alone."""
    out, context = [], []
    for turn in (e.data for e in events if isinstance(e.data, TurnGenerated)):
        if turn.drift is not None:
            context = context[: turn.drift.offset]
        context = [*context, *turn.observation_token_ids]
        out.append((turn, list(context)))
        context += turn.output_token_ids
    return out


async def check_tokens_are_the_engines(url: str, events: dict[str, list[Event]], chat: ChatFormat) -> None:
    """Each turn's context, sent to the engine again with the turn's seed, gives the turn's tokens."""
    async with engine_client(url) as client:
        for tid, episode in events.items():
            for turn, context in contexts(episode):
                params = SamplingParams(
                    max_new_tokens=len(turn.output_token_ids),
                    temperature=MINI_AGENT.temperature,
                    seed=sampling_seed(tid, turn.turn),
                    stop_token_ids=chat.stop_token_ids,
                )
                again = await client.generate(context, params, f"check-{tid}-{turn.turn}")
                assert list(again.output_ids) == list(turn.output_token_ids), (tid, turn.turn)
