"""The `bwrap` command line of one sandbox: namespaces, capabilities and mounts.

No user namespace (we start as root, and the exec server must switch commands to
a dedicated host uid); every other namespace is unshared, so the network is
loopback only. All capabilities are dropped except the three the exec server
needs to run commands as the sandbox uid and to kill them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sandboxes.settings import SandboxSettings

SERVER_PATH_INSIDE = "/run/rollstream/bwrap_server.py"
ROOT_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32")
NAMESPACES = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try")
SERVER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL")


def python_home() -> str:
    """The running Python environment (a venv or the installation itself)."""
    return sys.prefix


def server_python() -> str:
    """The interpreter that runs the exec server: the real binary behind `sys.executable`."""
    return os.path.realpath(sys.executable)


def bwrap_argv(settings: SandboxSettings, workspace: Path, server_script: Path, uid: int) -> list[str]:
    bwrap = settings.bwrap
    argv = [bwrap.bwrap_path, *NAMESPACES, "--die-with-parent", "--new-session", "--hostname", "sandbox"]
    argv += ["--cap-drop", "ALL"]
    for cap in SERVER_CAPS:
        argv += ["--cap-add", cap]
    argv += ["--ro-bind", "/usr", "/usr"]
    argv += root_links()
    for path in bwrap.etc_paths:
        argv += ["--ro-bind-try", path, path]
    # /tmp first: a Python environment that lives under /tmp is bound on top of it, not hidden.
    argv += ["--perms", "1777", "--size", str(settings.limits.tmpfs_mb << 20), "--tmpfs", "/tmp"]
    for path in [*python_paths(bwrap.bind_python), *bwrap.ro_paths]:
        argv += traversable_parents(path)
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--bind", str(workspace), bwrap.workspace_mount]
    argv += ["--ro-bind", str(server_script), SERVER_PATH_INSIDE]
    argv += ["--chdir", bwrap.workspace_mount, "--"]
    limits = settings.limits
    argv += [server_python(), "-I", "-S", SERVER_PATH_INSIDE, str(uid), str(uid)]
    argv += [str(limits.cpu_time_s), str(limits.memory_mb << 20), str(limits.max_processes)]
    argv += [str(limits.file_size_mb << 20)]
    return argv


def traversable_parents(path: str) -> list[str]:
    """Parents of a bound path as plain 0755 dirs (bwrap would copy e.g. /root's 0700)."""
    argv: list[str] = []
    for parent in reversed(Path(path).parents[:-1]):
        if str(parent) not in ("/usr", "/tmp"):  # /tmp stays the sandbox's 1777 tmpfs
            argv += ["--perms", "0755", "--dir", str(parent)]
    return argv


def root_links() -> list[str]:
    """`/bin`, `/lib`, ... as the host has them: symlinks into /usr, or read-only binds."""
    argv: list[str] = []
    for path in ROOT_LINKS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def python_paths(bind_environment: bool) -> list[str]:
    """Host paths of the Python installation (always: the server needs it) and its venv."""
    paths = [sys.base_prefix]
    if bind_environment and sys.prefix != sys.base_prefix:
        paths.append(sys.prefix)
    return [path for path in paths if not path.startswith("/usr/")]
