"""The monitor's changelog topics, made on the real broker before faust starts, as faust declares them.

Faust checks a changelog's partition count against its source topic's at the first table
write; a changelog it had only just created could read as 0 partitions there and kill the
monitor (`PartitionsMismatch`, seen in CI). `rollstream monitor` makes them first."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from rollstream.config import Config
from streams.monitor.app import SOURCES, Monitor
from streams.topics import TopicError, TopicSpec, describe_topics, ensure_topics, partitions


async def _delete(config: Config, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=config.kafka.bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(names)
    finally:
        await admin.close()


def test_changelogs_are_made_with_their_sources_partition_counts_before_faust_starts(
    config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    config = config_factory()
    monitor = Monitor(config.kafka, config.topics, config.monitor, tmp_path / "monitor")  # as the command
    specs = monitor.changelog_specs()
    names = [spec.name for spec in specs]
    assert sorted(names) == sorted(table.changelog_topic_name for table in monitor.app.tables.values())
    assert {spec.partitions for spec in specs} == {partitions(config.topics, short) for short in SOURCES}
    try:
        for _ in range(2):  # a restart finds them made: no error, nothing changes
            asyncio.run(ensure_topics(config.kafka, specs, config.topics.create_timeout_s))
        described = asyncio.run(describe_topics(config.kafka, names))
    finally:
        asyncio.run(_delete(config, names))
    expires_ms = str(int(config.monitor.window_expires_s * 1000))
    for spec in specs:
        info = described[spec.name]
        assert info["partitions"] == info["leaders"] == str(spec.partitions), spec.name
        windowed = not spec.short.startswith("totals-")
        assert info["cleanup.policy"] == ("compact,delete" if windowed else "compact"), spec.name
        assert (info["retention.ms"] == expires_ms) is windowed, spec.name


def test_a_topic_of_another_partition_count_is_a_clear_error_not_a_wait(
    config_factory: Callable[..., Config],
) -> None:
    config = config_factory("topics.create_timeout_s=60")
    name = config.topics.prefix + "changelog-probe"
    asyncio.run(ensure_topics(config.kafka, [TopicSpec("probe", name, 2, 1, {})], 30))
    try:
        with pytest.raises(TopicError, match=f"{name} has 2 partitions, not 3.*delete it"):
            asyncio.run(ensure_topics(config.kafka, [TopicSpec("probe", name, 3, 1, {})], 60))
    finally:
        asyncio.run(_delete(config, [name]))
