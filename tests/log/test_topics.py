"""Topics on the real broker: every topic, the right configs, creation is idempotent."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from rollstream.config import Config
from streams.topics import SHORT_NAMES, TopicError, create_topics, delete_topics, list_topics, topic_name


async def test_create_topics_is_idempotent_with_configs(config_factory: Callable[..., Config]) -> None:
    config = config_factory(create_topics=False)
    first = await create_topics(config.kafka, config.topics)
    second = await create_topics(config.kafka, config.topics)
    assert first == second == [topic_name(config.topics, short) for short in SHORT_NAMES]

    topics = await list_topics(config.kafka, config.topics)
    assert set(topics) == set(first)
    name = lambda short: topic_name(config.topics, short)  # noqa: E731
    for short in ("rollout.events", "weights.history", "trainer.steps"):
        assert topics[name(short)]["retention.ms"] == "-1", short
        assert topics[name(short)]["cleanup.policy"] == "delete"
    assert topics[name("weights")]["cleanup.policy"] == "compact"
    assert topics[name("rollout.requests")]["retention.ms"] != "-1"
    assert topics[name("rollout.events")]["partitions"] == str(config.topics.rollout_events_partitions)
    assert topics[name("rollout.requests")]["partitions"] == str(config.topics.rollout_requests_partitions)
    for info in topics.values():
        assert info["leaders"] == info["partitions"]  # create_topics returns once every partition is led
        assert info["max.message.bytes"] == str(config.topics.max_message_bytes)
        assert info["min.insync.replicas"] == "1"


def test_delete_removes_only_the_prefixed_topics(config_factory: Callable[..., Config]) -> None:
    doomed, kept = config_factory(), config_factory()  # topics created
    deleted = asyncio.run(delete_topics(doomed.kafka, doomed.topics))
    assert deleted == sorted(topic_name(doomed.topics, short) for short in SHORT_NAMES)
    assert asyncio.run(list_topics(doomed.kafka, doomed.topics)) == {}
    assert len(asyncio.run(list_topics(kept.kafka, kept.topics))) == len(SHORT_NAMES)
    asyncio.run(delete_topics(kept.kafka, kept.topics))


async def test_concurrent_creation_is_harmless(config_factory: Callable[..., Config]) -> None:
    config = config_factory(create_topics=False)
    results = await asyncio.gather(*(create_topics(config.kafka, config.topics) for _ in range(3)))
    assert all(result == results[0] for result in results)


async def test_replication_beyond_the_cluster_is_a_clear_error(config_factory: Callable[..., Config]) -> None:
    config = config_factory("topics.replication_factor=3", create_topics=False)
    with pytest.raises(TopicError, match="replication_factor=3"):
        await create_topics(config.kafka, config.topics)


def test_unknown_short_name_is_rejected(base_config: Config) -> None:
    with pytest.raises(TopicError, match="unknown topic"):
        topic_name(base_config.topics, "rollout.event")
