"""Benchmarks on the local broker start it when it is not up (the first time fetches its jars),
and measure on fresh topics under a unique prefix (`fresh_topics`)."""

from __future__ import annotations

import uuid

from rollstream.command_line import fail
from rollstream.config import Config
from rollstream.launcher import kafka as kafka_launcher
from rollstream.launcher.process import LauncherError
from streams.settings import TopicSettings
from streams.topics import create_topics


def ensure_local_broker(cfg: Config) -> None:
    """Start the local broker when the config points at it; a remote cluster is left alone."""
    if not kafka_launcher.points_at_local_broker(cfg):
        return
    try:
        kafka_launcher.ensure_up(cfg)
    except LauncherError as error:
        fail(str(error))


async def fresh_topics(config: Config, prefix: str) -> TopicSettings:
    """Every topic created under `{prefix}-{8 random hex}-`; the settings that name them."""
    topics = config.topics.model_copy(update={"prefix": f"{prefix}-{uuid.uuid4().hex[:8]}-"})
    await create_topics(config.kafka, topics)
    return topics
