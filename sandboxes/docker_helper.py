"""The docker sandboxes' exec helper binary: built from `sandboxes/helper/*.c`, once per source version.

The helper runs as PID 1 of every docker sandbox (see `sandboxes/helper/main.c` and
`sandboxes/docker_channel.py`), bind-mounted read-only from the host, so it must run in
any image: it is a static C binary (glibc, `-static`), needing nothing from the image,
not even a libc. C, not Go: a Go runtime starts threads as it pleases, and in a
sandbox whose pids cap a fork bomb has spent, a thread it cannot create kills it
(`runtime: failed to create new OS thread`); this helper is one thread and forks only
to spawn a command.

`helper_binary(settings)` returns `sandbox.docker.helper_path` when set (a prebuilt
binary, e.g. on cluster nodes without a compiler), else the binary built from the
sources into `sandbox.docker.helper_dir` (default `~/.cache/rollstream/helper`), named by
a digest of the sources and compiler flags: a changed source builds a new one, and
checkouts at different versions share the directory safely. The build takes a few
seconds, under a file lock, so concurrent first uses build once. `make setup` builds it
ahead (`python -m sandboxes.docker_helper`); a worker builds it on first use otherwise.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from sandboxes.base import BackendUnavailableError
from sandboxes.settings import DockerSettings

SOURCE_DIR = Path(__file__).with_name("helper")
CFLAGS = ("-std=gnu11", "-D_GNU_SOURCE", "-O2", "-static", "-s", "-Wall", "-Wextra", "-Werror")
BINARY_PREFIX = "rollstream-exec-"


class HelperBuildError(BackendUnavailableError):
    """The helper could not be built or found; the message says why and what to do."""

    def __init__(self, message: str) -> None:
        super().__init__(message, backend="docker")


def source_digest() -> str:
    """A digest of the helper's sources and build flags (names the binary built from them)."""
    digest = hashlib.sha256(" ".join(CFLAGS).encode())
    for path in sorted(SOURCE_DIR.glob("*.[ch]")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def default_helper_dir() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "rollstream" / "helper"


def helper_binary(settings: DockerSettings) -> Path:
    """The helper binary to bind-mount: the configured one, or the one built from our sources."""
    if settings.helper_path:
        configured = Path(settings.helper_path).resolve()
        if not (configured.is_file() and os.access(configured, os.X_OK)):
            raise HelperBuildError(
                f"sandbox.docker.helper_path={settings.helper_path} is not an executable file; build one "
                "with `python -m sandboxes.docker_helper` or leave the setting empty to build on first use"
            )
        return configured
    folder = (Path(settings.helper_dir) if settings.helper_dir else default_helper_dir()).resolve()
    return build(folder)


def build(folder: Path) -> Path:
    """The binary for the current sources in `folder`, compiled there first if missing."""
    target = folder / f"{BINARY_PREFIX}{source_digest()}"
    if target.is_file():
        return target
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "build.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.is_file():  # another process may have built it while we waited
                _compile(target)
    except OSError as error:
        raise HelperBuildError(
            f"cannot build the docker exec helper in {folder}: {error}; "
            "set sandbox.docker.helper_dir to a writable directory"
        ) from None
    return target


def _compile(target: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise HelperBuildError(
            "no C compiler to build the docker exec helper (sandboxes/helper/); run scripts/setup_system.sh "
            "(gcc, libc6-dev) or set sandbox.docker.helper_path to a prebuilt binary"
        )
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    sources = [str(path) for path in sorted(SOURCE_DIR.glob("*.c"))]
    argv = [compiler, *CFLAGS, "-o", str(partial), *sources]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise HelperBuildError(
            f"building the docker exec helper failed ({' '.join(argv)}): {result.stderr.strip()[-2000:]}; "
            "a static build needs libc6-dev (scripts/setup_system.sh)"
        )
    partial.chmod(0o755)
    partial.rename(target)  # atomic: a reader sees no binary or a whole one


if __name__ == "__main__":
    print(helper_binary(DockerSettings()), file=sys.stdout)
