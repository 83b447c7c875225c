"""`rollstream model init [--out DIR]` and `rollstream model info`: the policy model directory."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agents.chat import ChatFormat
from rollstream.commands.common import ConfigPath, Overrides, console, fail, read_config
from trainer.checkpoint import check_model_dir, init_model_dir, load_model

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
    """Print the architecture, size, dtype, weight version and stop tokens of a model directory."""
    settings = read_config(config, overrides)
    path = out or settings.model_dir
    try:
        described = check_model_dir(path)
        chat = ChatFormat.from_model_dir(path)
    except (FileNotFoundError, ValueError) as error:
        fail(f"{path} is not a model directory we can run: {error}")
    model = described.model
    stops = {t: chat.decode_exact([t]) for t in chat.stop_token_ids}
    console.print(f"[bold]{path}[/]")
    console.print(
        f"  architecture   {model.architecture} ({model.num_layers} layers, hidden {model.hidden_size})"
    )
    console.print(f"  parameters     {load_model(path).num_parameters():,} ({described.dtype} on disk)")
    console.print(f"  weight version {described.weight_version}")
    console.print(f"  vocabulary     {chat.tokenizer.get_vocab_size()} tokens, stop tokens {stops}")
