"""Who owns a docker sandbox: the owner label, and whether that owner is gone.

A container's owner is `host/pid/start-time` of the process whose factory made it;
the start time (from /proc) tells a live owner from a later process that reused the
pid. Only owners on this host can be judged; others are never called gone.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path


def owner_label() -> str:
    """host/pid/start-time of this process: a pid alone could be reused by another program."""
    return f"{socket.gethostname()}/{os.getpid()}/{_process_start(os.getpid())}"


def _process_start(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return ""


def owner_is_gone(owner: str) -> bool:
    """True when `owner` names a process on this host that no longer runs."""
    host, _, rest = owner.partition("/")
    pid_text, _, started = rest.partition("/")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    return _process_start(int(pid_text)) != started
