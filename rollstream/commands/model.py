"""`rollstream model init [--out DIR]` and `rollstream model info`: the policy model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from rollstream.commands.common import ConfigPath, Overrides, console, fail, read_config
from trainer.checkpoint import init_model_dir, load_model
from trainer.checkpoint import read_config as read_model_config
from trainer.tokenizer import load_tokenizer, special_token_ids

app = typer.Typer(help="Create and inspect the policy model (Hugging Face layout).", no_args_is_help=True)

OutDir = Annotated[Path | None, typer.Option("--out", help="model directory (default: config model dir)")]


@app.command("init")
def init(config: ConfigPath = None, overrides: Overrides = None, out: OutDir = None) -> None:
    """Create a randomly initialised model (sizes from [model] settings) and its tokenizer."""
    settings = read_config(config, overrides)
    path = out or settings.model_dir
    with console.status(f"training the tokenizer and initialising the model in {path}"):
        try:
            init_model_dir(settings.model, path)
        except (FileExistsError, ValueError) as error:
            fail(str(error))
    console.print(f"created {path} ({load_model(path).num_parameters():,} parameters)")


@app.command("info")
def info(config: ConfigPath = None, overrides: Overrides = None, out: OutDir = None) -> None:
    """Print the architecture, size, weight version and special tokens of a model directory."""
    settings = read_config(config, overrides)
    path = out or settings.model_dir
    try:
        described = read_model_config(path)
        tokenizer = load_tokenizer(path)
    except (FileNotFoundError, KeyError) as error:
        fail(f"{path} is not a model directory: {error}")
    console.print(f"[bold]{path}[/]")
    console.print(f"  architecture   {described.model}")
    console.print(f"  parameters     {load_model(path).num_parameters():,}")
    console.print(f"  weight version {described.weight_version}")
    specials = special_token_ids(tokenizer)
    console.print(f"  vocabulary     {tokenizer.get_vocab_size()} tokens, specials {specials}")
