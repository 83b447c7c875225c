"""The gateway a worker's OpenAI-speaking scaffold needs (`agent.scaffold = "mini-swe-agent"`).

`worker_gateway` yields None for our own scaffold, else the session gateway in the worker's
event loop in front of the engine client (or, for `--policy expert`, of the family's expert in
mini-swe-agent's tool-calling form, served on loopback over the engine protocol), with the
threads mini-swe-agent's agents run in. Used by `rollstream rollout` and by evaluations.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

from agents.chat import ChatFormat
from agents.engine.client import EngineClient
from agents.engine.policy_server import serving_policy
from agents.gateway.generation import StreamingPolicy
from agents.mini_swe.runtime import AgentGateway
from rollstream.config import Config


@asynccontextmanager
async def worker_gateway(
    cfg: Config, chat: ChatFormat, client: EngineClient, model_dir: Path, *, expert: bool = False
) -> AsyncIterator[AgentGateway | None]:
    if cfg.agent.scaffold != "mini-swe-agent":
        yield None
        return
    from agents.mini_swe.expert import MiniExpertPolicy
    from agents.mini_swe.runtime import agent_gateway

    async with AsyncExitStack() as stack:
        policy: StreamingPolicy = client
        if expert:
            url = await stack.enter_async_context(
                serving_policy(MiniExpertPolicy(chat, cfg.expert, cfg.agent))
            )
            settings = cfg.client.model_copy(update={"urls": (url,)})
            policy = await stack.enter_async_context(EngineClient(settings))
        yield await stack.enter_async_context(
            agent_gateway(
                chat,
                policy,
                cfg.gateway,
                cfg.agent.mini,
                state_dir=cfg.state_dir,
                model_name=cfg.gateway.model_name or Path(model_dir).resolve().name,
                threads=max(cfg.rollout.concurrency, cfg.eval.concurrency),
            )
        )
