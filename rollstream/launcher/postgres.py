"""The local PostgreSQL server (second event-store backend): `ensure_up(config) -> admin URL`,
`down`, `is_up`, `create_database`, `drop_database`.

Debian's server binaries (`/usr/lib/postgresql/<v>/bin`) run as the `postgres`
system user (PostgreSQL refuses to run as root). Data lives in
`<state_dir>/postgres/data` (or, when the `postgres` user cannot reach the state
dir, in a per-state-dir folder under /tmp). The server listens on 127.0.0.1 only,
with trust authentication and a superuser role `postgres.user` (rollstream). It is
a scratch server for development and tests: fsync is off.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
from sqlalchemy.engine import make_url

from rollstream.config import Config
from rollstream.launcher.process import LauncherError, log_tail, port_in_use
from sandboxes.file_lock import file_lock

SERVER_SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "unix_socket_directories": "''",
    "max_connections": "200",
    "shared_buffers": "'128MB'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "logging_collector": "off",
}
DATABASE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def admin_url(config: Config) -> str:
    return f"postgresql+psycopg://{config.postgres.user}@127.0.0.1:{config.postgres.port}/postgres"


def bin_dir(config: Config) -> Path:
    """The directory holding initdb and pg_ctl, or a clear error."""
    if config.postgres.bin_dir:
        candidates = [Path(config.postgres.bin_dir)]
    else:
        candidates = sorted(
            Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True
        )
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    raise LauncherError(
        "PostgreSQL server binaries (initdb, pg_ctl) not found under "
        f"{config.postgres.bin_dir or '/usr/lib/postgresql/*/bin'}: run scripts/setup_system.sh "
        "or apt-get install postgresql"
    )


def _as_server_user(config: Config, argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `argv` as the postgres system user when we are root (the server refuses root)."""
    if os.geteuid() == 0:
        argv = ["runuser", "-u", config.postgres.system_user, "--", *argv]
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise LauncherError(f"{' '.join(argv)} did not finish within {timeout:.0f}s") from None


def server_dir(config: Config) -> Path:
    """`<state_dir>/postgres`, or a /tmp folder when the server user cannot traverse the state dir."""
    preferred = config.state_dir.resolve() / "postgres"
    if os.geteuid() != 0:
        return preferred
    preferred.parent.mkdir(parents=True, exist_ok=True)
    probe = _as_server_user(config, ["test", "-x", str(preferred.parent)], timeout=10)
    if probe.returncode == 0:
        return preferred
    digest = hashlib.sha1(str(preferred).encode()).hexdigest()[:10]
    return Path(tempfile.gettempdir()) / f"rollstream-postgres-{digest}"


def _prepare(config: Config, root: Path) -> Path:
    """Create and initdb the data dir (owned by the server user) when it does not exist yet."""
    data = root / "data"
    if (data / "PG_VERSION").exists():
        return data
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:
        shutil.chown(root, config.postgres.system_user, config.postgres.system_user)
    initdb = str(bin_dir(config) / "initdb")
    done = _as_server_user(
        config,
        [initdb, "-D", str(data), "-U", config.postgres.user, "--auth=trust", "-E", "UTF8", "--locale=C"],
        timeout=180,
    )
    if done.returncode != 0:
        raise LauncherError(f"initdb failed for {data}:\n{(done.stdout + done.stderr).strip()[-2000:]}")
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("\n# rollstream postgres up\n")
        conf.write(f"port = {config.postgres.port}\n")
        for key, value in SERVER_SETTINGS.items():
            conf.write(f"{key} = {value}\n")
    return data


def _answers(config: Config) -> bool:
    try:
        with psycopg.connect(**_connect_args(admin_url(config)), connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _running(config: Config, data: Path) -> bool:
    pg_ctl = str(bin_dir(config) / "pg_ctl")
    return _as_server_user(config, [pg_ctl, "status", "-D", str(data)], timeout=30).returncode == 0


def ensure_up(config: Config) -> str:
    """Start the server unless it runs; return the admin URL once it accepts connections."""
    root = server_dir(config)
    with file_lock(config.state_dir.resolve() / "postgres.lock"):
        data = _prepare(config, root)
        if not _running(config, data):
            if port_in_use(config.postgres.port):
                if _answers(config):
                    return admin_url(config)  # a server this state dir did not start already serves
                raise LauncherError(
                    f"port {config.postgres.port} is taken by another process; stop it or set postgres.port"
                )
            _start(config, root, data)
        _wait_answers(config, root)
    return admin_url(config)


def _start(config: Config, root: Path, data: Path) -> None:
    pg_ctl = str(bin_dir(config) / "pg_ctl")
    timeout = config.postgres.startup_timeout_s
    argv = [pg_ctl, "start", "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", f"{timeout:.0f}"]
    done = _as_server_user(config, argv, timeout=timeout + 10)
    if done.returncode != 0:
        tail = log_tail(root / "server.log", lines=20)
        raise LauncherError(f"PostgreSQL did not start:\n{(done.stdout + done.stderr).strip()}\n{tail}")


def _wait_answers(config: Config, root: Path) -> None:
    deadline = time.monotonic() + config.postgres.startup_timeout_s
    while not _answers(config):
        if time.monotonic() > deadline:
            raise LauncherError(
                f"PostgreSQL on port {config.postgres.port} does not answer; see {root}/server.log"
            )
        time.sleep(0.5)


def is_up(config: Config) -> bool:
    return _answers(config)


def down(config: Config) -> bool:
    """Stop the server (fast shutdown); False when it was not running."""
    root = server_dir(config)
    data = root / "data"
    if not (data / "PG_VERSION").exists() or not _running(config, data):
        return False
    pg_ctl = str(bin_dir(config) / "pg_ctl")
    done = _as_server_user(config, [pg_ctl, "stop", "-D", str(data), "-m", "fast", "-w"], timeout=120)
    if done.returncode != 0:
        raise LauncherError(f"pg_ctl stop failed:\n{(done.stdout + done.stderr).strip()}")
    return True


def _connect_args(url: str) -> dict[str, object]:
    parsed = make_url(url)
    return {
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 5432,
        "user": parsed.username,
        "password": parsed.password,
        "dbname": parsed.database or "postgres",
        "autocommit": True,
    }


def _check_name(name: str) -> None:
    if not DATABASE_NAME.match(name):
        raise LauncherError(f"database name {name!r} must match {DATABASE_NAME.pattern}")


def create_database(admin: str, name: str) -> str:
    """Create database `name` (kept if it exists); return its SQLAlchemy URL."""
    _check_name(name)
    with psycopg.connect(**_connect_args(admin)) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(admin).set(database=name).render_as_string(hide_password=False)


def drop_database(admin: str, name: str) -> None:
    """Drop database `name`, closing its open connections first."""
    _check_name(name)
    with psycopg.connect(**_connect_args(admin)) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
