"""What every command shares: the `--config`/`--set` options, reading the config, the model directory
check, the console and error reporting.

A library module (it was `rollstream/commands/common.py`): commands, the launchers, the run's
progress and summary and the benchmarks import it; it imports no command.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
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


def config_args(config: Path | None, overrides: Sequence[str] | None) -> list[str]:
    """The `--config FILE --set KEY=VALUE ...` arguments that give a child process our config."""
    sets = [arg for item in overrides or [] for arg in ("--set", item)]
    return [*(["--config", str(config)] if config else []), *sets]


def new_run_id(kind: str) -> str:
    """A fresh run id, `KIND-YYYYmmdd-HHMMSS-xxxxxx`: sorts by start time, unique across processes."""
    return f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


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
