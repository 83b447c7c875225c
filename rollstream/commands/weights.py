"""`rollstream weights follow`: keep SGLang-compatible engines on a run's published weights.

    rollstream weights follow --run RUN [--engine URL ...]

Consumes `weights` for RUN (from the start, then following) and loads every
`trainer.sync_every`-th version into each engine by POST /update_weights_from_disk,
after verifying the version's checksum (see `agents.engine.follow`). `--engine`
replaces `client.urls`. Runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Annotated

import typer

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.config import Config
from rollstream.weights_follow import follow_engines, show_follower_log

app = typer.Typer(help="Weight versions on the log.", no_args_is_help=True)


@app.callback()
def weights() -> None:
    """Weight versions on the log (a group even with one command, so `follow` keeps its name)."""


@app.command("follow")
def follow(
    run: Annotated[str, typer.Option("--run", help="the run whose weight versions to follow")],
    engine: Annotated[
        list[str] | None, typer.Option("--engine", help="engine URL, repeatable (default: client.urls)")
    ] = None,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Load each published weight version of RUN into SGLang-compatible engines."""
    cfg = read_config(config, overrides)
    urls = tuple(engine or cfg.client.urls)
    if not run.strip():
        fail("--run is empty: name the run whose weights to follow")
    if not urls:
        fail("no engine to update: pass --engine URL or set client.urls")
    show_follower_log()
    console.print(
        f"following weights of run {run!r} on {cfg.kafka.bootstrap} (prefix {cfg.topics.prefix!r}): "
        f"every {cfg.trainer.sync_every} version(s) into {', '.join(urls)}"
    )
    asyncio.run(_follow(cfg, run, urls))


async def _follow(cfg: Config, run: str, urls: tuple[str, ...]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    follower = await follow_engines(cfg, run, urls, stop)
    served = ", ".join(f"{name} v{version}" for name, version in sorted(follower.served.items())) or "-"
    loads, refused = len(follower.loads), len(follower.refused)
    console.print(f"stopped: {loads} load(s), {refused} refused; serving {served}")
