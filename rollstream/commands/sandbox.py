"""`rollstream sandbox exec`: run one command in a fresh sandbox and print its ExecResult as JSON.

A single COMMAND argument is a shell command line (`-- 'ls | wc -l'`); several
are one argv, quoted for the shell (`-- python -c 'print(1)'`). The command's
own failure is a result (exit code 0 here, the command's in the JSON); an
infrastructure error (the sandbox could not start, died, or stopped answering)
prints its kind and exits 3.
"""

from __future__ import annotations

import asyncio
import json
import shlex
from pathlib import Path
from typing import Annotated

import typer

from rollstream.command_line import ConfigPath, Overrides, fail, read_config
from sandboxes.backends import BACKENDS, make_factory
from sandboxes.base import ExecResult, SandboxError
from sandboxes.pool import SandboxPool
from sandboxes.settings import SandboxSettings

app = typer.Typer(help="Run commands in sandboxes.", no_args_is_help=True)
INFRA_ERROR_EXIT = 3


@app.callback()
def sandbox_group() -> None:
    """Run commands in sandboxes (bwrap, docker, e2b)."""


@app.command("exec")
def exec_command(
    command: Annotated[list[str], typer.Argument(help="the command, after `--`")],
    backend: Annotated[str | None, typer.Option(help=f"one of {', '.join(BACKENDS)}")] = None,
    workspace: Annotated[
        Path | None, typer.Option(help="directory copied into the sandbox's workspace")
    ] = None,
    timeout: Annotated[float | None, typer.Option(help="seconds; default limits.command_timeout_s")] = None,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Run COMMAND in a fresh sandbox; print the ExecResult as one JSON object."""
    settings = read_config(config, overrides).sandbox
    if backend is not None:
        if backend not in BACKENDS:
            fail(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}", code=2)
        settings = settings.model_copy(update={"backend": backend})
    if workspace is not None and not workspace.is_dir():
        fail(f"--workspace {workspace} is not a directory", code=2)
    line = command[0] if len(command) == 1 else shlex.join(command)
    try:
        result = asyncio.run(run_once(settings, workspace, line, timeout))
    except SandboxError as error:
        fail(f"infra_error:{error.kind}: {error}", code=INFRA_ERROR_EXIT)
    print(json.dumps(result.to_json_dict()))


async def run_once(
    settings: SandboxSettings, workspace: Path | None, line: str, timeout: float | None
) -> ExecResult:
    pool = SandboxPool(
        settings.model_copy(update={"pool": settings.pool.model_copy(update={"warm_pool": 0})}),
        make_factory(settings),
    )
    async with pool, pool.sandbox(workspace.resolve() if workspace else None) as box:
        return await box.exec(line, timeout=timeout)
