"""mini-swe-agent, unmodified, as it is set up for a rollout worker.

What a worker's mini-swe-agent episodes share (`AgentGateway`): the session gateway they call
(in the worker's event loop, on loopback) and the threads their synchronous agents run in (one
per episode slot, so the pool never binds before `rollout.concurrency` does).

mini-swe-agent reads some settings from its environment when it is first imported (its
startup banner, its global config directory, its model-call retries) and litellm fetches a
price list from the network unless told not to: `prepare_environment` sets those before the
first import, from `agent.mini` (their own documented variables, no patching).

`agent_config` is mini-swe-agent's own config file (`agent.mini.config`, by default the
`mini.yaml` its `mini` command uses: its prompts, observation and format-error templates)
with only the model section pointed at the session: its default model class (litellm's
tool-calling `LitellmModel`) with model `openai/<served model>`, the session's base URL and
key, `[agent]`'s sampling, and cost tracking set to ignore a model litellm has no price for.
"""

from __future__ import annotations

import copy
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.chat import ChatFormat
from agents.gateway.generation import StreamingPolicy
from agents.gateway.registry import Gateway
from agents.gateway.server import GatewayServer
from agents.settings import AgentSettings, GatewaySettings, MiniSweSettings

MINI_PACKAGE = "mini-swe-agent"
INSTALL_HINT = "mini-swe-agent is not installed: pip install 'rollstream[mini]' (it pins mini-swe-agent 2.x)"


class MiniUnavailable(RuntimeError):
    """mini-swe-agent cannot be imported; the message says how to install it."""


@dataclass
class AgentGateway:
    server: GatewayServer
    threads: ThreadPoolExecutor


@asynccontextmanager
async def agent_gateway(
    chat: ChatFormat,
    policy: StreamingPolicy,
    settings: GatewaySettings,
    mini: MiniSweSettings,
    *,
    state_dir: Path,
    model_name: str,
    threads: int,
) -> AsyncIterator[AgentGateway]:
    """A worker's gateway (in its event loop) and agent threads, for as long as the block runs."""
    prepare_environment(mini, state_dir)
    check_installed()
    load_config(mini.config)  # a wrong config name fails the worker at start, not every episode
    async with GatewayServer(Gateway(chat, policy, settings, model_name)) as server:
        pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="mini-swe-agent")
        try:
            yield AgentGateway(server, pool)
        finally:  # an agent still running fails at its next call (the gateway is gone): do not wait
            pool.shutdown(wait=False, cancel_futures=True)


def prepare_environment(settings: MiniSweSettings, state_dir: Path) -> None:
    """mini-swe-agent's and litellm's environment variables (module docstring); call before importing it."""
    os.environ["MSWEA_SILENT_STARTUP"] = "1"
    os.environ["MSWEA_GLOBAL_CONFIG_DIR"] = settings.state_dir or str(state_dir / "mini")
    os.environ["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] = str(settings.model_retries)
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"


def check_installed() -> str:
    """mini-swe-agent's version; MiniUnavailable when it cannot be imported."""
    try:
        import minisweagent
    except ImportError as error:
        raise MiniUnavailable(f"{INSTALL_HINT} ({error})") from None
    return str(minisweagent.__version__)


def load_config(name: str) -> dict[str, Any]:
    """One of mini-swe-agent's built-in configs by file name, or a YAML file by path."""
    import yaml
    from minisweagent.config import get_config_path

    try:
        path = get_config_path(name)
    except FileNotFoundError as error:
        raise ValueError(f"agent.mini.config {name!r}: {error}") from None
    config = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(config, dict) or "agent" not in config:
        raise ValueError(f"agent.mini.config {name!r} ({path}) has no `agent` section")
    return config


def agent_config(
    config: dict[str, Any], agent: AgentSettings, model_name: str, base_url: str, key: str
) -> dict[str, Any]:
    """`config` with its model section pointed at one session (module docstring)."""
    out = copy.deepcopy(config)
    model = out.setdefault("model", {})
    kwargs = dict(model.get("model_kwargs") or {})
    # top_k is not an OpenAI parameter (litellm drops it): the session's sampling defaults carry it
    kwargs.update(api_base=base_url, api_key=key, temperature=agent.temperature, top_p=agent.top_p)
    model.update(model_name=f"openai/{model_name}", model_kwargs=kwargs, cost_tracking="ignore_errors")
    return out
