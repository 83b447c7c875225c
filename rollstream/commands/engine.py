"""`rollstream engine serve`: the embedded engine behind SGLang's HTTP contract."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollstream.commands.common import ConfigPath, Overrides, console, fail, read_config

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
) -> None:
    """Serve a model directory until interrupted (Ctrl-C)."""
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
    run_server(model_dir, settings.engine)
