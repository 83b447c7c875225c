"""The three-broker KRaft cluster started by the launcher: nothing acked is lost when a
broker is SIGKILLed mid-produce, and the launcher restarts a killed node (stale pid file,
or a pid file naming another live program) while `up` on a running cluster is harmless."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from rollstream.config import Config, load_config
from rollstream.launcher import kafka
from streams.bus import EventProducer, read_topic
from streams.eventgen import sample_event
from streams.topics import create_topics, topic_name

BROKERS = 3
EVENTS = 10_000

pytestmark = pytest.mark.timeout(400)


@pytest.fixture(scope="module")
def cluster(base_config: Config) -> Iterator[Config]:
    """A fresh 3-node cluster for this module; stopped and wiped afterwards."""
    kafka.down(base_config, BROKERS, wipe=True)
    try:
        kafka.ensure_up(base_config, BROKERS)
        yield base_config
    finally:
        kafka.down(base_config, BROKERS, wipe=True)


def _cluster_config(base: Config) -> Config:
    return load_config(
        None,
        [
            *kafka.cluster_overrides(base, BROKERS),
            f'topics.prefix="c-{uuid.uuid4().hex[:8]}-"',
            "topics.rollout_events_partitions=3",
            "topics.rollout_requests_partitions=3",
            "topics.trajectories_partitions=1",
            "topics.groups_partitions=1",
        ],
    )


async def _leader_of_partition_zero(config: Config) -> int:
    """Asked until every broker's metadata has the new topic (they catch up one by one)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=config.kafka.bootstrap)
    await admin.start()
    try:
        for _ in range(120):
            [topic] = await admin.describe_topics([topic_name(config.topics, "rollout.events")])
            zero = [p for p in topic["partitions"] if p["partition"] == 0 and p["leader"] >= 0]
            if zero and len(zero[0]["replicas"]) == BROKERS:
                return int(zero[0]["leader"])
            await asyncio.sleep(0.5)
        raise AssertionError(f"partition 0 never showed {BROKERS} replicas: {topic}")
    finally:
        await admin.close()


async def test_nothing_acked_is_lost_when_a_broker_is_killed(cluster: Config) -> None:
    config = _cluster_config(cluster)
    await create_topics(config.kafka, config.topics)
    victim = await _leader_of_partition_zero(config)
    events = [sample_event("tool.executed", i) for i in range(EVENTS)]
    async with EventProducer(config.kafka, config.topics) as producer:
        for i, event in enumerate(events):
            await producer.send("rollout.events", event)
            if i == EVENTS // 3:
                await asyncio.to_thread(kafka.kill_node, cluster, victim, BROKERS)
        await producer.flush()
    got = await read_topic(config.kafka, config.topics, "rollout.events", idle_s=15.0)
    ids = [c.event.id for c in got]
    missing = {event.id for event in events} - set(ids)
    assert not missing, f"{len(missing)} acked events lost after node {victim} was killed"
    assert len(ids) == len(set(ids)) == EVENTS, f"{len(ids) - len(set(ids))} duplicates"
    assert {node.node_id: node.pid for node in kafka.status(cluster, BROKERS)}[victim] is None


def test_launcher_restarts_killed_node_and_up_twice_is_harmless(cluster: Config) -> None:
    setup_nodes = kafka.status(cluster, BROKERS)
    dead = [node for node in setup_nodes if node.pid is None]
    if not dead:  # run on its own: kill one here
        kafka.kill_node(cluster, BROKERS, BROKERS)
    dead_id = dead[0].node_id if dead else BROKERS
    pid_file = kafka.node_pid_file(cluster, dead_id, BROKERS)
    pid_file.write_text(f"{os.getpid()}\n")  # a live pid that is not a broker: must count as stale

    bootstrap = kafka.ensure_up(cluster, BROKERS)
    assert kafka.is_up(cluster, BROKERS)
    first = {node.node_id: node.pid for node in kafka.status(cluster, BROKERS)}
    assert all(first.values()) and first[dead_id] != os.getpid()

    assert kafka.ensure_up(cluster, BROKERS) == bootstrap
    assert {node.node_id: node.pid for node in kafka.status(cluster, BROKERS)} == first
