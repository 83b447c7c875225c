"""`rollstream engine serve`: the embedded engine behind SGLang's HTTP contract; with
`--follow-weights RUN`, it also loads RUN's published weight versions (`agents.engine.follow`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.config import Config

app = typer.Typer(help="The embedded inference engine (SGLang-compatible HTTP).", no_args_is_help=True)


@app.command("serve")
def serve(
    config: ConfigPath = None,
    overrides: Overrides = None,
    model: Annotated[Path | None, typer.Option("--model", help="model directory (default: config)")] = None,
    port: Annotated[int | None, typer.Option("--port", help="HTTP port (default: engine.port)")] = None,
    context_length: Annotated[
        int | None, typer.Option("--context-length", help="engine-side context cap in tokens")
    ] = None,
    max_running_requests: Annotated[
        int | None, typer.Option("--max-running-requests", help="requests decoded together")
    ] = None,
    follow_weights: Annotated[
        str | None,
        typer.Option("--follow-weights", metavar="RUN", help="load RUN's weight versions from `weights`"),
    ] = None,
) -> None:
    """Serve a model directory until interrupted (Ctrl-C); with --follow-weights, follow a run's weights."""
    from agents.engine.server import serve as run_server

    flags = [
        f"engine.{key}={value}"
        for key, value in (
            ("port", port),
            ("context_length", context_length),
            ("max_running_requests", max_running_requests),
        )
        if value is not None
    ]
    settings = read_config(config, [*(overrides or []), *flags])
    model_dir = model or settings.model_dir
    if not (model_dir / "config.json").is_file():
        fail(f"{model_dir} is not a model directory: create one with `rollstream model init --out DIR`")
    console.print(
        f"serving {model_dir} on http://{settings.engine.host}:{settings.engine.port} "
        f"(context {settings.engine.context_length}, max running {settings.engine.max_running_requests})"
    )
    if follow_weights is None:
        run_server(model_dir, settings.engine)
    elif not follow_weights.strip():
        fail("--follow-weights is empty: name the run whose weights to follow")
    else:
        console.print(
            f"following weights of run {follow_weights!r} on {settings.kafka.bootstrap} "
            f"(every {settings.trainer.sync_every} version(s))"
        )
        serve_following(settings, model_dir, follow_weights)


def serve_following(settings: Config, model_dir: Path, run: str) -> None:
    """The server with a weights follower in its event loop, updating its engine in process."""
    from aiohttp import web

    from agents.engine.engine import Engine
    from agents.engine.follow import EmbeddedTarget, WeightsFollower, follow_in_app
    from agents.engine.server import create_app
    from rollstream.weights_follow import show_follower_log

    show_follower_log()
    host, port = settings.engine.host, settings.engine.port
    engine = Engine(model_dir, settings.engine).start()
    follower = WeightsFollower(
        settings.kafka,
        settings.topics,
        run,
        [EmbeddedTarget(engine, f"http://{host}:{port}")],
        sync_every=settings.trainer.sync_every,
        settings=settings.follow,
    )
    app = create_app(engine, f"http://{host}:{port}")
    app.cleanup_ctx.append(follow_in_app(follower))
    web.run_app(app, host=host, port=port, print=None)
