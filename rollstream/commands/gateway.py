"""`rollstream gateway serve`: the session gateway on its own, for any OpenAI-speaking agent.

    rollstream gateway serve [--engine URL ...] [--model DIR] [--host H] [--port N]

OpenAI's `/v1/chat/completions` in front of the engines (`client.urls`, or `--engine`), for
sessions a harness opens and closes over HTTP with the admin token (`agents.gateway.admin`);
every call is written to `rollout.events` with its exact token ids. The model directory gives
the chat template and tokenizer (the engines must serve the same model). It binds loopback
unless `--host` (or `gateway.host`) says otherwise. The admin token is read from the variable
named by `gateway.admin_token_env`, else a new one is written to `<state_dir>/gateway.token`.
"""

from __future__ import annotations

import asyncio
import gc
import os
import secrets
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.config import Config

if TYPE_CHECKING:
    from agents.chat import ChatFormat

app = typer.Typer(
    help="The session gateway: OpenAI chat completions, every call on the log.", no_args_is_help=True
)


def admin_token(cfg: Config) -> tuple[str, str]:
    """The admin token and where it came from (module docstring)."""
    name = cfg.gateway.admin_token_env
    if os.environ.get(name):
        return os.environ[name], f"${name}"
    path = cfg.state_dir / "gateway.token"
    path.parent.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return token, str(path)


@app.command("serve")
def serve(
    config: ConfigPath = None,
    overrides: Overrides = None,
    engine: Annotated[
        list[str] | None, typer.Option("--engine", help="engine URL (repeat for several)")
    ] = None,
    model: Annotated[Path | None, typer.Option("--model", help="model directory (default: config)")] = None,
    host: Annotated[
        str | None, typer.Option("--host", help="address to bind (default: gateway.host)")
    ] = None,
    port: Annotated[
        int | None, typer.Option("--port", help="HTTP port (default: gateway.port; 0 = free)")
    ] = None,
) -> None:
    """Serve the gateway until interrupted (Ctrl-C)."""
    flags = [f'gateway.host="{host}"'] if host else []
    flags += [f"gateway.port={port}"] if port is not None else []
    cfg = read_config(config, [*(overrides or []), *flags])
    if engine:
        cfg = cfg.model_copy(update={"client": cfg.client.model_copy(update={"urls": tuple(engine)})})
    from agents.chat import ChatFormat

    model_dir = model or cfg.model_dir
    try:
        chat = ChatFormat.from_model_dir(model_dir)
    except (FileNotFoundError, ValueError) as error:
        fail(str(error))
    token, where = admin_token(cfg)
    asyncio.run(_serve(cfg, chat, cfg.gateway.model_name or Path(model_dir).resolve().name, token, where))


async def _serve(cfg: Config, chat: ChatFormat, model_name: str, token: str, token_source: str) -> None:
    from agents.engine.faults import make_client
    from agents.event_sink import KafkaEventSink
    from agents.gateway.admin import SessionAdmin
    from agents.gateway.registry import Gateway
    from agents.gateway.server import GatewayServer
    from streams.bus import EventProducer

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with make_client(cfg.client) as client, EventProducer(cfg.kafka, cfg.topics) as producer:
        gateway = Gateway(chat, client, cfg.gateway, model_name)
        admin = SessionAdmin(
            gateway, KafkaEventSink(producer), token, f"gateway-{socket.gethostname()}-{os.getpid()}"
        )
        async with GatewayServer(gateway, admin.add_routes) as server:
            admin.server = server
            # Everything alive now (torch's and the libraries' modules, hundreds of thousands of
            # objects) lives as long as the process: out of the collector's full passes, which the
            # sessions' messages trigger, so those passes cost what the sessions hold, not the imports.
            gc.freeze()
            console.print(
                f"gateway for {model_name!r} at {server.url} over {', '.join(cfg.client.urls)}; "
                f"admin token: {token_source}"
            )
            print(server.url, flush=True)
            await stop.wait()
