"""podman's Docker-compatible API for the docker sandbox backend, where no Docker engine runs.

`ensure_up(config) -> str` starts `podman --runtime runc system service` on a unix
socket at `<state_dir>/podman/podman.sock` (crun fails on this machine's cgroups;
runc works) unless it already answers, and returns its address
(`unix:///abs/path/podman.sock`) for `sandbox.docker.base_url`. `down(config)` stops
it, `is_up(config)` asks it. `ensure_image(config)` also builds and imports the
sandbox image (`sandboxes.image`).

Run `python -m rollstream.launcher.podman up|image|down|status` by hand.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import typer

from rollstream.command_line import ConfigPath, Overrides, fail, read_config
from rollstream.config import Config
from rollstream.launcher.process import (
    LauncherError,
    is_running,
    live_pid,
    log_tail,
    start_detached,
    stop_processes,
)
from sandboxes.file_lock import file_lock
from sandboxes.image import ImageBuildError, ImageReport
from sandboxes.image import ensure_image as build_and_import

PODMAN = ("podman", "--runtime", "runc")  # crun fails on this machine's cgroups; runc works
MARKER = "system service"
MAX_SOCKET_PATH = 100  # sockaddr_un holds 108 bytes
STARTUP_TIMEOUT_S = 60.0
T = TypeVar("T")


def podman_dir(config: Config) -> Path:
    return (config.state_dir / "podman").resolve()


def socket_path(config: Config) -> Path:
    return podman_dir(config) / "podman.sock"


def base_url(config: Config) -> str:
    return f"unix://{socket_path(config)}"


def is_up(config: Config) -> bool:
    """True when the service answers `/_ping` on its socket."""
    socket = socket_path(config)
    if not socket.exists():
        return False
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket)), timeout=5.0) as client:
            return client.get("http://podman/_ping").status_code == 200
    except httpx.HTTPError:
        return False


def ensure_up(config: Config) -> str:
    """Start the service unless it answers; returns its address. Safe from many processes."""
    folder = podman_dir(config)
    with file_lock(folder / "launch.lock"):
        if is_up(config):
            return base_url(config)
        if shutil.which("podman") is None:
            raise LauncherError("podman is not installed; run scripts/setup_system.sh")
        socket = socket_path(config)
        if len(str(socket)) > MAX_SOCKET_PATH:
            raise LauncherError(f"socket path {socket} is too long for a unix socket; shorten state_dir")
        pid = live_pid(folder / "podman.pid", MARKER)
        if pid is not None:  # ours, but not answering: replace it
            stop_processes([pid], grace_s=5.0)
        socket.unlink(missing_ok=True)
        argv = [*PODMAN, "system", "service", "--time=0", f"unix://{socket}"]
        pid = start_detached(argv, folder / "podman.log", folder / "podman.pid", cwd=folder)
        _wait_until_up(config, folder, pid)
    return base_url(config)


def _wait_until_up(config: Config, folder: Path, pid: int) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if is_up(config):
            return
        if not is_running(pid):
            break
        time.sleep(0.2)
    stop_processes([pid], grace_s=5.0)
    raise LauncherError(
        f"podman system service did not answer on {socket_path(config)}; its log:\n"
        + log_tail(folder / "podman.log")
    )


def down(config: Config) -> bool:
    """Stop the service if we started it; True when one was stopped. Containers keep running."""
    folder = podman_dir(config)
    with file_lock(folder / "launch.lock"):
        pid = live_pid(folder / "podman.pid", MARKER)
        if pid is None:
            return False
        stop_processes([pid], grace_s=10.0)
        (folder / "podman.pid").unlink(missing_ok=True)
        socket_path(config).unlink(missing_ok=True)
        return True


def ensure_image(config: Config) -> ImageReport:
    """Service up and `sandbox.docker.image` on it (built from Debian packages when missing)."""
    url = ensure_up(config)
    return build_and_import(config.sandbox.docker, url, config.state_dir / "images")


app = typer.Typer(help="podman's Docker-compatible API for the docker sandbox backend.", no_args_is_help=True)


@app.command()
def up(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Start the service (idempotent) and print its address for sandbox.docker.base_url."""
    print(_run(ensure_up, read_config(config, overrides)))


@app.command()
def image(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Start the service and build/import the sandbox image when it is missing."""
    report = _run(ensure_image, read_config(config, overrides))
    print(
        f"{report.image}: built={report.built} imported={report.imported} "
        f"build_s={report.build_s:.1f} import_s={report.import_s:.1f}"
    )


@app.command(name="down")
def stop(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Stop the service started by `up` (running containers are left alone)."""
    print("stopped" if _run(down, read_config(config, overrides)) else "not running")


@app.command()
def status(config: ConfigPath = None, overrides: Overrides = None) -> None:
    """Print the service's address and whether it answers."""
    settings = read_config(config, overrides)
    print(f"{base_url(settings)} {'up' if is_up(settings) else 'down'}")


def _run(action: Callable[[Config], T], config: Config) -> T:
    try:
        return action(config)
    except (LauncherError, ImageBuildError) as error:
        fail(str(error))


if __name__ == "__main__":
    app()
