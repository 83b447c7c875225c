"""Benchmarks on the local broker start it when it is not up (the first time fetches its jars)."""

from __future__ import annotations

from rollstream.commands.common import fail
from rollstream.config import Config
from rollstream.launcher import kafka as kafka_launcher
from rollstream.launcher.process import LauncherError


def ensure_local_broker(cfg: Config) -> None:
    """Start the local broker when the config points at it; a remote cluster is left alone."""
    if not kafka_launcher.points_at_local_broker(cfg):
        return
    try:
        kafka_launcher.ensure_up(cfg)
    except LauncherError as error:
        fail(str(error))
