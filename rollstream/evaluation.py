"""Evaluate a model directory on a task set: its own engine process, real sandboxes, events to the log.

`evaluate_model` starts `rollstream engine serve --model DIR` on a free port (unless an
engine URL is given), waits for its `/health`, runs `agents.evaluate.evaluate` with the
rollout worker's episode services and a Kafka sink, and stops the engine. The eval's
run id names its events; their `policy_version` is the version the engine served, so
`pass@1 by weight version` is a SQL query once the sink has copied them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from agents.chat import ChatFormat
from agents.engine.client import EngineClient
from agents.evaluate import AttemptResult, EvalResult, evaluate
from agents.event_sink import KafkaEventSink
from agents.submit import limits_of
from rollstream.agent_gateway import worker_gateway
from rollstream.config import Config
from rollstream.launcher.process import free_port
from rollstream.rollout_services import episode_services
from rollstream.supervisor import Supervisor
from sandboxes.backends import make_factory
from sandboxes.pool import SandboxPool
from sandboxes.tasks import load_tasks
from streams.bus import EventProducer
from streams.topics import create_topics
from trainer.checkpoint import read_config as read_model_config


class EngineStartError(RuntimeError):
    """The eval's engine did not answer /health in time; the message points at its log."""


async def wait_for_engine(url: str, timeout_s: float, alive: Callable[[], None] = lambda: None) -> None:
    """Poll `url`/health until it answers 200; `alive()` raises if the engine process died."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        while time.monotonic() < deadline:
            alive()
            try:
                async with session.get(f"{url}/health") as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.5)
    raise EngineStartError(f"no engine answered {url}/health within {timeout_s:.0f}s")


def evaluate_model(
    cfg: Config,
    model_dir: Path,
    tasks_dir: Path,
    run_id: str,
    *,
    log_dir: Path,
    config_args: list[str],
    engine_url: str = "",
    on_result: Callable[[AttemptResult], None] | None = None,
) -> EvalResult:
    """pass@1 of `model_dir` on `tasks_dir` (`cfg.eval.attempts` each), its events under `run_id`."""
    if engine_url:
        return asyncio.run(_evaluate(cfg, model_dir, tasks_dir, run_id, engine_url, on_result, lambda: None))
    port = free_port()
    with Supervisor(log_dir, config_args, cfg.supervisor, restart=False) as pipeline:
        pipeline.start(
            f"engine-{run_id}", ["engine", "serve", "--model", str(model_dir), "--port", str(port)]
        )
        url = f"http://127.0.0.1:{port}"
        return asyncio.run(_evaluate(cfg, model_dir, tasks_dir, run_id, url, on_result, pipeline.check_alive))


async def _evaluate(
    cfg: Config,
    model_dir: Path,
    tasks_dir: Path,
    run_id: str,
    url: str,
    on_result: Callable[[AttemptResult], None] | None,
    alive: Callable[[], None],
) -> EvalResult:
    await create_topics(cfg.kafka, cfg.topics)  # idempotent: an eval may be the first thing run
    await wait_for_engine(url, cfg.eval.engine_start_timeout_s, alive)
    chat = ChatFormat.from_model_dir(model_dir)
    client_settings = cfg.client.model_copy(update={"urls": (url,)})
    pool = SandboxPool(cfg.sandbox, make_factory(cfg.sandbox))
    async with (
        EngineClient(client_settings) as client,
        pool,
        EventProducer(cfg.kafka, cfg.topics) as producer,
        worker_gateway(cfg, chat, client, model_dir) as gateway,
    ):
        services = episode_services(cfg, client, pool, chat, gateway)
        result = await evaluate(
            run_id,
            load_tasks(tasks_dir),
            cfg.eval.attempts,
            services=services,
            sink=KafkaEventSink(producer),
            limits=limits_of(cfg.policy),
            concurrency=cfg.eval.concurrency,
            max_infra_reruns=cfg.eval.max_infra_reruns,
            model_version=read_model_config(model_dir).weight_version,
            on_result=on_result,
        )
        await producer.flush()
    return result
