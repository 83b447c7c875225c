"""`rollstream postgres up|down|status`: the local PostgreSQL server (port postgres.port)."""

from __future__ import annotations

import typer

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.launcher import postgres
from rollstream.launcher.process import LauncherError

app = typer.Typer(help="The local PostgreSQL server under <state_dir>/postgres.", no_args_is_help=True)


@app.command()
def up(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Start the server unless it runs; print the admin URL once it accepts connections."""
    cfg = read_config(config, overrides)
    try:
        with console.status("starting PostgreSQL..."):
            url = postgres.ensure_up(cfg)
    except LauncherError as error:
        fail(str(error))
    print(url)


@app.command()
def down(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Stop the server (fast shutdown: open sessions are closed)."""
    cfg = read_config(config, overrides)
    try:
        stopped = postgres.down(cfg)
    except LauncherError as error:
        fail(str(error))
    console.print("PostgreSQL stopped" if stopped else "PostgreSQL was not running")


@app.command()
def status(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Say whether the server accepts connections; exit 1 when it does not."""
    cfg = read_config(config, overrides)
    if postgres.is_up(cfg):
        console.print(f"PostgreSQL is up: {postgres.admin_url(cfg)}")
    else:
        console.print("PostgreSQL is down")
        raise typer.Exit(1)
