"""An engine that stops under an episode's request (SIGTERM: the supervisor restarting it, or the
end of a run) does not end the episode as `infra_error:engine`.

Before, the stopping engine finished every request in flight with finish reason "abort", the
client took that as the answer, and the episode recorded an infrastructure error it had not
caused (one in the 1,204 trajectories of a quiet demo: the pipeline's processes were all sent
SIGTERM at once at its end, and the rollout worker drained its episodes while the engine
stopped). Now the engine answers 503 "engine_stopping", the client retries, and the engine that
replaces it on the same address answers. Deterministic: the first engine is paused, so the
request is certainly in its queue when it stops.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agents.chat import ChatFormat
from agents.engine.client import EngineClient
from agents.engine.engine import Engine
from agents.engine.server import create_app
from agents.episode import Episode, EpisodeServices, EpisodeSpec
from agents.settings import AgentSettings, ClientSettings
from rollstream.launcher.process import free_port
from sandboxes.base import Sandbox
from sandboxes.simulated import SimulatedLatency, SimulatedSandboxFactory
from sandboxes.tasks import Verdict
from sandboxes.tasks.harbor import Task, TaskMetadata
from streams.outcomes import Outcome
from streams.payloads import Limits
from tests.agents.conftest import Collected
from tests.agents.test_episode import DirectSandboxes
from tests.engine.conftest import EngineFactory, make_engine, model_dir  # noqa: F401 (fixtures)
from trainer.tokenizer import load_tokenizer

pytestmark = pytest.mark.timeout(120)


@asynccontextmanager
async def serving_on(engine: Engine, port: int) -> AsyncIterator[web.AppRunner]:
    """`engine` over HTTP on `port`; leaving stops the server as SIGTERM stops `rollstream engine
    serve` (aiohttp's shutdown runs the app's on_shutdown, which stops the engine)."""
    runner = web.AppRunner(create_app(engine, f"http://127.0.0.1:{port}"))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_address=True).start()
    try:
        yield runner
    finally:
        await runner.cleanup()


async def verifier(box: Sandbox, task: Task) -> Verdict:
    return Verdict(0.0, {"test_fix": False}, {}, 0.01)


def episode(chat: ChatFormat, client: EngineClient) -> tuple[Episode, Collected]:
    task = Task("task-1", Path("/nonexistent"), "Fix the bug.", None, TaskMetadata(("test_fix",)))
    services = EpisodeServices(
        policy=client,
        sandboxes=DirectSandboxes(SimulatedSandboxFactory(SimulatedLatency(time_scale=0.001))),
        verifier=verifier,
        chat=chat,
        agent=AgentSettings(),
        backend="simulated",
        source="test",
        command_timeout_s=10.0,
    )
    limits = Limits(max_turns=1, max_new_tokens_per_turn=8)
    spec = EpisodeSpec("run", "group", "traj", task, 0, 0, 4, limits)
    sink = Collected()
    return Episode(spec, services, sink), sink


async def test_an_episode_rides_out_its_engine_stopping_under_its_request(
    make_engine: EngineFactory,  # noqa: F811 (the fixture imported above)
    model_dir: Path,  # noqa: F811
) -> None:
    chat = ChatFormat.for_tokenizer(load_tokenizer(model_dir))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    client = EngineClient(ClientSettings(urls=(url,), retries=6, retry_backoff_s=0.2))
    first = make_engine()
    first.pause()  # the request waits in the queue: in flight when the engine stops
    async with client:
        run, sink = episode(chat, client)
        async with serving_on(first, port):
            running = asyncio.create_task(run.run())
            while first.stats().queued == 0:
                assert not running.done(), running
                await asyncio.sleep(0.01)
        # the first engine stopped with the request in flight; its replacement takes the retry
        async with serving_on(make_engine(), port):
            finished = await asyncio.wait_for(running, timeout=60)
    assert finished.outcome == Outcome.TRUNCATED_TURNS and finished.error is None, finished
    assert client.metrics().errors.get("engine", 0) >= 1  # the 503 "engine_stopping", retried
    turn = next(e.data for e in sink.events if e.type == "turn.generated")
    assert turn.finish_reason != "abort"  # type: ignore[attr-defined]


async def test_a_stopping_engine_answers_503_not_an_abort(
    make_engine: EngineFactory,  # noqa: F811 (the fixture imported above)
) -> None:
    engine = make_engine()
    engine.pause()
    port = free_port()
    body = {"input_ids": [3, 4, 5], "sampling_params": {"max_new_tokens": 4}, "rid": "r1"}
    async with aiohttp.ClientSession() as http:
        async with serving_on(engine, port):
            reply = asyncio.create_task(http.post(f"http://127.0.0.1:{port}/generate", json=body))
            while engine.stats().queued == 0:
                await asyncio.sleep(0.01)
        async with await reply as answer:
            assert answer.status == 503, await answer.text()
            assert (await answer.json())["error"]["type"] == "engine_stopping"
