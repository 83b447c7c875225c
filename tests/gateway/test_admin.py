"""A standalone gateway's sessions over HTTP, on real Kafka: a harness opens a session with the admin
token, its agent calls the gateway with the openai client, the harness closes it with its reward;
the trajectory on `rollout.events` folds with the ids a rollout worker would give that attempt."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import aiohttp
import openai

from agents.chat import ChatFormat
from agents.engine.engine import Engine
from agents.engine.server import create_app
from agents.event_sink import KafkaEventSink
from agents.gateway.admin import CloseRequest, SessionAdmin, closing_outcome
from agents.gateway.registry import Gateway
from agents.gateway.server import GatewayServer
from agents.identity import group_id, trajectory_id
from agents.settings import EngineSettings, GatewaySettings
from rollstream.config import Config
from streams.assemble import Trajectory, fold_trajectory
from streams.bus import EventProducer, read_topic
from streams.outcomes import Outcome
from streams.payloads import TrajectoryFinished
from streams.topics import create_topics
from tests.gateway.conftest import MODEL, engine_client, serve

TOKEN = "admin-secret"


async def test_sessions_opened_and_closed_over_http_are_trajectories_on_the_log(
    config_factory: Callable[..., Config], model_dir: Path, chat: ChatFormat
) -> None:
    config = config_factory(create_topics=False)
    await create_topics(config.kafka, config.topics)
    engine = Engine(model_dir, EngineSettings(context_length=2048, torch_threads=1)).start()
    try:
        async with (
            serve(create_app(engine)) as url,
            engine_client(url) as client,
            EventProducer(config.kafka, config.topics) as producer,
        ):
            gateway = Gateway(chat, client, GatewaySettings(), MODEL)
            admin = SessionAdmin(gateway, KafkaEventSink(producer), TOKEN, "test-gateway")
            async with GatewayServer(gateway, admin.add_routes) as server, aiohttp.ClientSession() as http:
                admin.server = server
                opened = await post(
                    http, f"{server.url}/sessions", {"run_id": "h", "task_id": "t1", "attempt": 1}
                )
                assert opened["status"] == 401  # no admin token
                body = {
                    "run_id": "h",
                    "task_id": "t1",
                    "attempt": 1,
                    "group_size": 2,
                    "limits": {"max_turns": 2},
                }
                opened = await post(http, f"{server.url}/sessions", body, TOKEN)
                assert opened["status"] == 201
                await converse(opened["base_url"], opened["api_key"], turns=2)
                closed = await post(
                    http, f"{server.url}/sessions/{opened['session_id']}/close", {"reward": 1.0}, TOKEN
                )
                again = await post(
                    http, f"{server.url}/sessions/{opened['session_id']}/close", {"reward": 1.0}, TOKEN
                )
    finally:
        engine.stop()
    group = group_id("h", "t1", 0)
    assert opened["trajectory_id"] == trajectory_id(group, 1, 0) and opened["group_id"] == group
    assert closed["status"] == 200 and closed["outcome"] == "resolved" and closed["turns"] == 2
    assert again["status"] == 404
    consumed = await read_topic(config.kafka, config.topics, "rollout.events", idle_s=0.5)
    events = [c.event for c in consumed if c.event.trajectory_id == opened["trajectory_id"]]
    folded = fold_trajectory(events)
    assert isinstance(folded, Trajectory) and folded.outcome == Outcome.RESOLVED and folded.reward == 1.0
    assert folded.turns == 2 and folded.group_size == 2 and folded.limits.max_turns == 2
    finished = events[-1].data
    assert isinstance(finished, TrajectoryFinished) and finished.history_drifts == 0


def test_a_session_that_ended_itself_keeps_its_outcome_and_infra_errors_have_no_reward() -> None:
    assert closing_outcome(Outcome.TRUNCATED_TURNS, CloseRequest(reward=0.0)) == (
        Outcome.TRUNCATED_TURNS,
        0.0,
    )
    assert closing_outcome(None, CloseRequest(reward=0.5)) == (Outcome.UNRESOLVED, 0.5)
    assert closing_outcome(None, CloseRequest(outcome=Outcome.INFRA_SANDBOX_LOST)) == (
        Outcome.INFRA_SANDBOX_LOST,
        None,
    )


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, object], token: str = "") -> dict:  # type: ignore[type-arg]
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.post(url, json=body, headers=headers) as reply:
        return {"status": reply.status, **(await reply.json())}


async def converse(base_url: str, key: str, turns: int) -> None:
    messages: list[dict[str, object]] = [{"role": "user", "content": "Say hi."}]
    async with openai.AsyncOpenAI(base_url=base_url, api_key=key, max_retries=0) as client:
        for _ in range(turns):
            answer = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
            messages += [
                answer.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "more"},
            ]
