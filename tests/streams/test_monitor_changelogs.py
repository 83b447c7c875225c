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
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from rollstream.config import Config
from streams.monitor.app import SOURCES, Monitor
from streams.topics import TopicError, TopicSpec, ensure_topics, partitions


async def _described(config: Config, names: list[str]) -> dict[str, tuple[int, bool, str, str]]:
    """name -> (partitions, every partition led, cleanup.policy, retention.ms)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=config.kafka.bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics(names)
        resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        configs = await admin.describe_configs(resources)
    finally:
        await admin.close()
    values = {
        name: {entry[0]: entry[1] for entry in entries}
        for response in configs
        for _code, _msg, _type, name, entries in response.resources
    }
    return {
        t["topic"]: (
            len(t["partitions"]),
            all(p["leader"] >= 0 for p in t["partitions"]),
            values[t["topic"]]["cleanup.policy"],
            values[t["topic"]]["retention.ms"],
        )
        for t in described
    }


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
        described = asyncio.run(_described(config, names))
    finally:
        asyncio.run(_delete(config, names))
    expires_ms = str(int(config.monitor.window_expires_s * 1000))
    for spec in specs:
        count, led, policy, retention = described[spec.name]
        assert (count, led) == (spec.partitions, True), spec.name
        windowed = not spec.short.startswith("totals-")
        assert policy == ("compact,delete" if windowed else "compact"), spec.name
        assert (retention == expires_ms) is windowed, spec.name


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
