"""Fixtures of the gateway tests: the tiny default model served by the real engine over HTTP (or
a scripted policy over the same protocol), the gateway in front of it, and sessions whose events
are collected in order (`Written`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from agents.chat import ChatFormat
from agents.engine.client import EngineClient
from agents.engine.engine import Engine
from agents.engine.policy_server import create_policy_app
from agents.engine.server import create_app
from agents.gateway.registry import Gateway
from agents.gateway.server import GatewayServer
from agents.gateway.session import Session, SessionSpec
from agents.policy import Policy
from agents.settings import ClientSettings, EngineSettings, GatewaySettings
from streams.payloads import Limits, Payload, TurnGenerated
from trainer.checkpoint import init_model_dir
from trainer.settings import ModelSettings

MODEL = "tiny"


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(ModelSettings(), tmp_path_factory.mktemp("gateway-model") / "m")


@pytest.fixture(scope="session")
def chat(model_dir: Path) -> ChatFormat:
    return ChatFormat.from_model_dir(model_dir)


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@dataclass
class Written:
    """A session's events in the order they were written (the rollout worker's sink stands in here)."""

    payloads: list[Payload] = field(default_factory=list)

    async def emit(self, payload: Payload) -> None:
        self.payloads.append(payload)

    @property
    def turns(self) -> list[TurnGenerated]:
        return [p for p in self.payloads if isinstance(p, TurnGenerated)]


@dataclass
class Served:
    """A gateway at `server.url` over an engine at `engine_url`."""

    gateway: Gateway
    server: GatewayServer
    engine: Engine | None
    engine_url: str
    client: EngineClient

    def open(
        self, *, limits: Limits | None = None, timeout_s: float = 600.0, tid: str = "t-1"
    ) -> tuple[Session, Written]:
        written = Written()
        spec = SessionSpec("run", "group", tid, "task", limits or Limits(), timeout_s)
        return self.gateway.open(spec, written.emit), written


def engine_client(url: str, retries: int = 1) -> EngineClient:
    return EngineClient(ClientSettings(urls=(url,), retries=retries, retry_backoff_s=0.01, timeout_s=120.0))


@asynccontextmanager
async def gateway_over(
    chat: ChatFormat, engine_url: str, engine: Engine | None = None, retries: int = 1
) -> AsyncIterator[Served]:
    async with engine_client(engine_url, retries) as client:
        gateway = Gateway(chat, client, GatewaySettings(), MODEL)
        async with GatewayServer(gateway) as server:
            yield Served(gateway, server, engine, engine_url, client)


EngineOptions = Callable[..., EngineSettings]


@pytest.fixture
async def served(model_dir: Path, chat: ChatFormat) -> AsyncIterator[Served]:
    """The tiny model in the real engine, over HTTP, behind the gateway."""
    engine = Engine(model_dir, EngineSettings(context_length=2048, torch_threads=1)).start()
    try:
        async with serve(create_app(engine)) as url, gateway_over(chat, url, engine) as served:
            yield served
    finally:
        engine.stop()


@asynccontextmanager
async def scripted(chat: ChatFormat, policy: Policy) -> AsyncIterator[Served]:
    """A scripted policy served over the engine protocol, behind the gateway."""
    async with serve(create_policy_app(policy)) as url, gateway_over(chat, url) as served:
        yield served
