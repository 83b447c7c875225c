"""Engines kept on a run's published weights: `follow_engines` (the `rollstream weights follow`
command, the tests) and `show_follower_log` (that command and `rollstream engine --follow-weights`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from agents.engine.follow import WeightsFollower, http_targets
from rollstream.config import Config


def show_follower_log() -> None:
    """Loads at INFO, refusals and unreachable engines at ERROR, on stderr."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("agents.engine.follow").setLevel(logging.INFO)


async def follow_engines(cfg: Config, run: str, urls: Sequence[str], stop: asyncio.Event) -> WeightsFollower:
    """Follow `run`'s weights into the engines at `urls` until `stop` is set; the follower, for its counts."""
    async with http_targets(urls, cfg.follow) as targets:
        follower = WeightsFollower(
            cfg.kafka, cfg.topics, run, targets, sync_every=cfg.trainer.sync_every, settings=cfg.follow
        )
        await follower.run(stop)
    return follower
