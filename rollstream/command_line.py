"""What every command shares: the `--config`/`--set` options, reading the config, the model directory
check, the console and error reporting.

A library module (it was `rollstream/commands/common.py`): commands, the launchers, the run's
progress and summary and the benchmarks import it; it imports no command.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console

from rollstream.config import Config, ConfigError, load_config

console = Console()
err_console = Console(stderr=True)

ConfigPath = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML config file (default: ./rollstream.toml)")
]
Overrides = Annotated[
    list[str] | None, typer.Option("--set", "-s", help="override a setting, e.g. policy.max_turns=40")
]


def read_config(path: Path | None, overrides: list[str] | None) -> Config:
    """The effective config, or a clear error and exit code 2."""
    try:
        return load_config(path, overrides or [])
    except ConfigError as error:
        fail(str(error), code=2)


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `message` as an error and exit with `code` (raises typer.Exit)."""
    err_console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def resolve_model_dir(cfg: Config, model: str | Path | None = None, dtype: str | None = None) -> Path:
    """The model directory a command runs: `model` (a directory or a known name, fetched when missing),
    else the config's. Checked before any process starts (family, weights, tokenizer, chat template,
    `dtype` on this machine); a clear error and exit code 1 when it is not usable."""
    from trainer.checkpoint import check_model_dir
    from trainer.model_sources import ModelSourceError, resolve_model

    chosen = model if model is not None else (cfg.model.path or cfg.model_dir)
    try:
        path = resolve_model(chosen, cfg.state_dir)
        check_model_dir(path, dtype)
    except (ModelSourceError, FileNotFoundError, ValueError) as error:
        fail(str(error))
    return path
