"""Fixtures of the mini-swe-agent tests: learning-family tasks, the real bwrap sandbox pool and
verifier, and episode services whose agent is unmodified mini-swe-agent behind the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from agents.chat import ChatFormat
from agents.engine.client import EngineClient
from agents.episode import EpisodeServices
from agents.mini_swe.runtime import agent_gateway
from agents.settings import AgentSettings, ClientSettings, GatewaySettings
from rollstream.config import Config
from sandboxes.backends import make_factory
from sandboxes.base import Sandbox
from sandboxes.pool import SandboxPool
from sandboxes.tasks import Task, Verdict, run_verifier
from sandboxes.tasks.family import write_family
from tests.gateway.conftest import chat, model_dir  # noqa: F401 (fixtures: the tiny model's chat format)

MINI_AGENT = AgentSettings(scaffold="mini-swe-agent", temperature=0.7)


@pytest.fixture(scope="session")
def family_tasks(tmp_path_factory: pytest.TempPathFactory) -> list[Task]:
    return write_family(tmp_path_factory.mktemp("family"), "train", 6, seed=3)


async def verify(box: Sandbox, task: Task) -> Verdict:
    return await run_verifier(box, task, task.verifier_timeout_s)


@asynccontextmanager
async def mini_services(
    config: Config,
    chat_format: ChatFormat,
    engine_url: str,
    agent: AgentSettings = MINI_AGENT,
    threads: int = 4,
) -> AsyncIterator[EpisodeServices]:
    """Episode services with mini-swe-agent as the agent, its model the engine at `engine_url`."""
    client = EngineClient(ClientSettings(urls=(engine_url,), retries=1, retry_backoff_s=0.05))
    async with (
        client,
        SandboxPool(config.sandbox, make_factory(config.sandbox)) as pool,
        agent_gateway(
            chat_format,
            client,
            GatewaySettings(),
            agent.mini,
            state_dir=config.state_dir,
            model_name="policy",
            threads=threads,
        ) as gateway,
    ):
        yield EpisodeServices(
            policy=client,
            sandboxes=pool,
            verifier=verify,
            chat=chat_format,
            agent=agent,
            backend=config.sandbox.backend,
            source="test-mini",
            command_timeout_s=60.0,
            gateway=gateway,
        )
