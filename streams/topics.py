"""Every Rollstream topic, its partitions and configs, and idempotent creation.

Short names (`SHORT_NAMES`) are what code uses; `topic_name` adds the configured
prefix. Source-of-truth topics (`rollout.events`, `weights.history`,
`trainer.steps`) keep every record forever, and so do `groups` and `trajectories`:
a trainer checkpoint holds offsets into them, which must still exist on resume; `weights` is compacted (latest
version per run); every topic accepts messages up to `topics.max_message_bytes`
and uses `topics.replication_factor` / `topics.min_insync_replicas` (3 / 2 on the
three-broker cluster). `sandbox.lifecycle` is derived: the stream worker copies a
trajectory's `sandbox.*` events there when the trajectory folds (for the monitor).
Topics are never auto-created: `create_topics` (or
`rollstream topics create`) makes them, and returns only once every partition has
a leader.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.settings import KafkaSettings, TopicSettings

SHORT_NAMES = (
    "rollout.events",
    "rollout.requests",
    "rollout.control",
    "trajectories",
    "groups",
    "weights",
    "weights.history",
    "trainer.steps",
    "deadletter",
    "sandbox.lifecycle",
)
RETAIN_FOREVER = frozenset({"rollout.events", "weights.history", "trainer.steps", "groups", "trajectories"})
COMPACTED = frozenset({"weights"})
TOPIC_ALREADY_EXISTS = 36


class TopicError(RuntimeError):
    """Topics could not be created or are unknown; the message says which and why."""


@dataclass(frozen=True)
class TopicSpec:
    short: str
    name: str
    partitions: int
    replication_factor: int
    configs: dict[str, str]


def topic_name(topics: TopicSettings, short: str) -> str:
    if short not in SHORT_NAMES:
        raise TopicError(f"unknown topic {short!r}; known: {', '.join(SHORT_NAMES)}")
    return topics.prefix + short


def short_name(topics: TopicSettings, name: str) -> str:
    """Inverse of `topic_name`."""
    if not name.startswith(topics.prefix) or name[len(topics.prefix) :] not in SHORT_NAMES:
        raise TopicError(f"topic {name!r} is not a Rollstream topic under prefix {topics.prefix!r}")
    return name[len(topics.prefix) :]


def partitions(topics: TopicSettings, short: str) -> int:
    counts = {
        "rollout.events": topics.rollout_events_partitions,
        "rollout.requests": topics.rollout_requests_partitions,
        "rollout.control": topics.rollout_control_partitions,
        "trajectories": topics.trajectories_partitions,
        "groups": topics.groups_partitions,
        "weights": topics.weights_partitions,
        "weights.history": topics.weights_partitions,
        "trainer.steps": topics.trainer_steps_partitions,
        "deadletter": topics.deadletter_partitions,
        "sandbox.lifecycle": topics.trajectories_partitions,
    }
    return counts[short]


def topic_specs(topics: TopicSettings) -> list[TopicSpec]:
    specs = []
    for short in SHORT_NAMES:
        configs = {
            "max.message.bytes": str(topics.max_message_bytes),
            "min.insync.replicas": str(topics.min_insync_replicas),
        }
        if short in RETAIN_FOREVER:
            configs |= {"retention.ms": "-1", "retention.bytes": "-1"}
        if short in COMPACTED:
            configs |= {"cleanup.policy": "compact", "retention.ms": "-1"}
        name = topic_name(topics, short)
        specs.append(TopicSpec(short, name, partitions(topics, short), topics.replication_factor, configs))
    return specs


def _admin(kafka: KafkaSettings) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(
        bootstrap_servers=kafka.bootstrap,
        client_id=kafka.client_id,
        request_timeout_ms=kafka.request_timeout_ms,
    )


async def create_topics(kafka: KafkaSettings, topics: TopicSettings) -> list[str]:
    """Create every topic that does not exist yet (existing ones are fine); return all names."""
    specs = topic_specs(topics)
    await ensure_topics(kafka, specs, topics.create_timeout_s)
    return [spec.name for spec in specs]


async def ensure_topics(kafka: KafkaSettings, specs: list[TopicSpec], timeout_s: float) -> None:
    """Create those of `specs` that do not exist yet, and return once every partition has a leader."""
    admin = _admin(kafka)
    await admin.start()
    try:
        brokers = len((await admin.describe_cluster())["brokers"])
        needed = max(spec.replication_factor for spec in specs)
        if needed > brokers:
            raise TopicError(
                f"topics.replication_factor={needed} but the cluster at {kafka.bootstrap} "
                f"has {brokers} broker(s); use the 3-broker cluster (rollstream kafka up --brokers 3) "
                "or lower the replication factor"
            )
        new = [
            NewTopic(spec.name, spec.partitions, spec.replication_factor, topic_configs=spec.configs)
            for spec in specs
        ]
        response = await admin.create_topics(new, timeout_ms=int(timeout_s * 1000))
        failures = [
            f"{name}: {message or code}"
            for name, code, message in response.topic_errors
            if code not in (0, TOPIC_ALREADY_EXISTS)
        ]
        if failures:
            raise TopicError("could not create topics:\n  " + "\n  ".join(failures))
        await _wait_for_leaders(admin, specs, timeout_s)
    finally:
        await admin.close()


async def _wait_for_leaders(admin: AIOKafkaAdminClient, specs: list[TopicSpec], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    names = [spec.name for spec in specs]
    while True:
        described = await admin.describe_topics(names)
        counts = {spec.name: spec.partitions for spec in specs}
        wrong = [
            f"{t['topic']} has {len(t['partitions'])} partitions, not {counts[t['topic']]}"
            for t in described
            if not t["error_code"] and t["partitions"] and len(t["partitions"]) != counts[t["topic"]]
        ]
        if wrong:  # an old topic of another layout: creating it again is a no-op, so waiting cannot help
            raise TopicError("; ".join(wrong) + ": delete it (or use another topics.prefix) and retry")
        ready = len(described) == len(specs) and all(
            not topic["error_code"]
            and len(topic["partitions"]) == counts[topic["topic"]]
            and all(p["leader"] >= 0 for p in topic["partitions"])
            for topic in described
        )
        if ready:
            return
        if time.monotonic() > deadline:
            raise TopicError(f"topics {names} have no leaders after {timeout_s:.0f}s")
        await asyncio.sleep(0.2)


async def list_topics(kafka: KafkaSettings, topics: TopicSettings) -> dict[str, dict[str, str]]:
    """Rollstream topics under the prefix, as `describe_topics` gives them."""
    admin = _admin(kafka)
    await admin.start()
    try:
        names = [name for name in await admin.list_topics() if _is_ours(topics, name)]
        return await _describe(admin, names) if names else {}
    finally:
        await admin.close()


async def describe_topics(kafka: KafkaSettings, names: list[str]) -> dict[str, dict[str, str]]:
    """name -> partitions, replication, leaders (partitions that have one), and the configs
    Rollstream sets (cleanup, retention, min.insync.replicas, max.message.bytes), sorted by name."""
    admin = _admin(kafka)
    await admin.start()
    try:
        return await _describe(admin, names)
    finally:
        await admin.close()


async def _describe(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, dict[str, str]]:
    described = await admin.describe_topics(names)
    resources = [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
    configs = await admin.describe_configs(resources)
    result: dict[str, dict[str, str]] = {}
    for topic in described:
        parts = topic["partitions"]
        result[topic["topic"]] = {
            "partitions": str(len(parts)),
            "replication": str(len(parts[0]["replicas"]) if parts else 0),
            "leaders": str(sum(1 for part in parts if part["leader"] >= 0)),
        }
    for response in configs:
        for _code, _msg, _type, name, entries in response.resources:
            values = {entry[0]: entry[1] for entry in entries}
            if name in result:
                result[name] |= {
                    key: values.get(key, "")
                    for key in ("cleanup.policy", "retention.ms", "min.insync.replicas", "max.message.bytes")
                }
    return dict(sorted(result.items()))


async def delete_topics(kafka: KafkaSettings, topics: TopicSettings) -> list[str]:
    """Delete the Rollstream topics under `topics.prefix` (tests and benchmarks clean up
    with it; the broker slows down with many thousands of partitions). Returns the names."""
    admin = _admin(kafka)
    await admin.start()
    try:
        names = sorted(name for name in await admin.list_topics() if _is_ours(topics, name))
        if names:
            await admin.delete_topics(names, timeout_ms=int(topics.create_timeout_s * 1000))
        deadline = time.monotonic() + topics.create_timeout_s
        while set(names) & set(await admin.list_topics()):  # deletion reaches metadata a bit later
            if time.monotonic() > deadline:
                raise TopicError(f"topics {names} still listed {topics.create_timeout_s:.0f}s after deletion")
            await asyncio.sleep(0.2)
    finally:
        await admin.close()
    return names


def _is_ours(topics: TopicSettings, name: str) -> bool:
    return name.startswith(topics.prefix) and name[len(topics.prefix) :] in SHORT_NAMES
