"""The bus against the real broker: every event type round-trips, large turns fit, a busy
partition is back-pressure rather than a failed delivery, bad records are dead-lettered with
their coordinates while good ones keep flowing."""

from __future__ import annotations

import asyncio
import base64
import json
from collections import defaultdict
from collections.abc import Callable

import pytest
from aiokafka import ConsumerRecord

from rollstream.config import Config
from streams.bus import Consumed, EventConsumer, EventProducer, read_topic
from streams.eventgen import sample_event
from streams.events import PAYLOADS, ROLLOUT_EVENT_TYPES, DecodeError, Event, decode_event, encode_event
from streams.fast_decode import decode_event_fast
from streams.topics import create_topics

PER_TYPE = 10_000
TOPIC_OF = {kind: "rollout.events" for kind in ROLLOUT_EVENT_TYPES} | {
    "trajectory.assembled": "trajectories",
    "group.formed": "groups",
    "rollout.requested": "rollout.requests",
    "rollout.abort": "rollout.control",
    "weights.published": "weights.history",
    "trainer.step": "trainer.steps",
    "deadletter.record": "deadletter",
}


def test_fast_codec_equals_reference_codec() -> None:
    for kind in PAYLOADS:
        for i in range(5):
            event = sample_event(kind, i, tokens=40 * i)
            raw = encode_event(event)
            assert raw == event.model_dump_json().encode()
            fast, reference = decode_event_fast(raw), decode_event(raw)
            assert fast == reference
            assert encode_event(fast) == raw
            assert fast.model_fields_set == reference.model_fields_set


@pytest.mark.parametrize(
    "change",
    [
        {"output_token_ids": [5, 6, 7]},  # arrays as JSON lists (records written before packing)
        {"output_token_ids": "!!not base64"},
        {"output_logprobs": "AAAA"},  # 3 bytes: not a whole float64
        {"engine_id": 7},
    ],
)
def test_fast_decode_falls_back_to_reference_results(change: dict[str, object]) -> None:
    raw = json.loads(encode_event(sample_event("turn.generated", 3, tokens=3)))
    raw["data"] |= change
    value = json.dumps(raw, separators=(",", ":")).encode()
    try:
        expected: Event | str = decode_event(value)
    except DecodeError as error:
        expected = error.reason
    try:
        got: Event | str = decode_event_fast(value)
    except DecodeError as error:
        got = error.reason
    assert got == expected


@pytest.mark.timeout(900)
async def test_every_type_round_trips(kafka_config: Config) -> None:
    assert set(TOPIC_OF) == set(PAYLOADS)
    sent: dict[str, list[Event]] = defaultdict(list)
    async with EventProducer(kafka_config.kafka, kafka_config.topics) as producer:
        for kind in PAYLOADS:
            for i in range(PER_TYPE):
                event = sample_event(kind, i, tokens=4)
                sent[TOPIC_OF[kind]].append(event)
                await producer.send(TOPIC_OF[kind], event)
    for short, events in sent.items():
        got = await read_topic(kafka_config.kafka, kafka_config.topics, short)
        assert len(got) == len(events), short
        assert {c.event.id: c.event for c in got} == {e.id: e for e in events}, short
        _assert_key_order(got)


def _assert_key_order(consumed: list[Consumed]) -> None:
    """Events of one key (group) keep their send order: seq increases along offsets."""
    by_key: dict[tuple[str | None, str], list[Consumed]] = defaultdict(list)
    for item in consumed:
        by_key[(item.event.group_id, item.event.type)].append(item)
    for items in by_key.values():
        assert len({item.partition for item in items}) == 1 or items[0].event.group_id is None
        ordered = sorted(items, key=lambda item: (item.partition, item.offset))
        if items[0].event.group_id is not None:
            assert [item.event.seq for item in ordered] == sorted(item.event.seq for item in ordered)


async def test_a_busy_partition_is_back_pressure_not_a_failed_delivery(
    config_factory: Callable[..., Config],
) -> None:
    """A hundred senders on one partition queue behind each other longer than aiokafka's
    `request_timeout_ms` allows for room in the queue (and it counts that wait down faster than
    it passes); the producer waits up to `kafka.max_block_ms` instead of failing a delivery."""
    config = config_factory(
        "kafka.request_timeout_ms=3000", "kafka.producer_batch_records=1", create_topics=False
    )
    await create_topics(config.kafka, config.topics)
    senders, per_sender = 100, 5
    events = [sample_event("turn.generated", i, tokens=4) for i in range(senders * per_sender)]
    one_key = [event.model_copy(update={"group_id": "one-group"}) for event in events]

    async def send_share(share: list[Event]) -> None:
        for event in share:
            await producer.send("rollout.events", event)

    async with EventProducer(config.kafka, config.topics) as producer:
        await asyncio.gather(*(send_share(one_key[i::senders]) for i in range(senders)))
    got = await read_topic(config.kafka, config.topics, "rollout.events")
    assert len({c.partition for c in got}) == 1
    assert sorted(c.event.id for c in got) == sorted(e.id for e in one_key)


async def test_turn_with_8192_tokens_fits(kafka_config: Config) -> None:
    event = sample_event("turn.generated", 1, tokens=8192)
    async with EventProducer(kafka_config.kafka, kafka_config.topics) as producer:
        await producer.send_and_wait("rollout.events", event)
    got = await read_topic(kafka_config.kafka, kafka_config.topics, "rollout.events")
    assert [c.event for c in got] == [event]
    assert len(got[0].event.data.output_logprobs) == 8192  # type: ignore[attr-defined]


async def test_bad_records_are_dead_lettered_and_good_ones_flow(kafka_config: Config) -> None:
    good = [sample_event("tool.executed", i) for i in range(30)]
    violating = json.loads(encode_event(sample_event("turn.generated", 99)))
    del violating["data"]["engine_id"]
    unknown = json.loads(encode_event(sample_event("sandbox.ready", 98))) | {"type": "sandbox.exploded"}
    bad = {
        b"\x00not json at all": "not JSON",
        json.dumps(unknown).encode(): "unknown event type",
        json.dumps(violating).encode(): "does not match its schema",
    }
    async with EventProducer(kafka_config.kafka, kafka_config.topics) as producer:
        for i, event in enumerate(good):
            await producer.send_raw("rollout.events", encode_event(event), b"one-key")
            if i % 10 == 5:
                value = list(bad)[i // 10]
                await producer.send_raw("rollout.events", value, b"one-key")
    consumer = EventConsumer(
        kafka_config.kafka, kafka_config.topics, ["rollout.events"], group_id="dl-test", name="dl-test"
    )
    received: list[Consumed] = []
    async with consumer:
        for _ in range(60):
            received += await consumer.batch(timeout_ms=500)
            if len(received) >= len(good) and consumer.dead_lettered >= len(bad):
                break
        await consumer.commit()
    assert [c.event for c in received] == good
    assert consumer.dead_lettered == len(bad)

    letters = await read_topic(kafka_config.kafka, kafka_config.topics, "deadletter")
    assert len(letters) == len(bad)
    partition = received[0].partition
    offsets = {c.offset for c in received}
    for letter in letters:
        record = letter.event.data
        assert letter.event.type == "deadletter.record"
        original = base64.b64decode(record.value_b64)  # type: ignore[attr-defined]
        assert bad[original] in record.reason  # type: ignore[attr-defined]
        assert record.topic == f"{kafka_config.topics.prefix}rollout.events"  # type: ignore[attr-defined]
        assert record.partition == partition  # type: ignore[attr-defined]
        assert record.offset not in offsets  # type: ignore[attr-defined]
        assert record.consumer == "dl-test"  # type: ignore[attr-defined]
        assert base64.b64decode(record.key_b64) == b"one-key"  # type: ignore[attr-defined, arg-type]
    # the bad records sit between the good ones at the offsets the dead letters name
    all_offsets = sorted(offsets | {letter.event.data.offset for letter in letters})  # type: ignore[attr-defined]
    assert all_offsets == list(range(all_offsets[0], all_offsets[0] + len(good) + len(bad)))


async def test_commit_resumes_after_the_committed_offset(kafka_config: Config) -> None:
    events = [sample_event("sandbox.requested", i) for i in range(20)]
    async with EventProducer(kafka_config.kafka, kafka_config.topics) as producer:
        for event in events:
            await producer.send("rollout.control", event)
    kafka, topics, shorts = kafka_config.kafka, kafka_config.topics, ["rollout.control"]
    async with EventConsumer(kafka, topics, shorts, group_id="g", name="a") as first:
        seen = await _read(first, 20)
        await first.commit({("rollout.control", 0): seen[9].offset + 1})
    async with EventConsumer(kafka, topics, shorts, group_id="g", name="b") as second:
        rest = await _read(second, 10)
    assert [c.event for c in rest] == events[10:]


async def _read(consumer: EventConsumer, count: int) -> list[Consumed]:
    out: list[Consumed] = []
    for _ in range(60):
        out += await consumer.batch(timeout_ms=500)
        if len(out) >= count:
            break
    return out


async def test_compacted_weights_are_keyed_by_run(kafka_config: Config) -> None:
    event = sample_event("weights.published", 4, run_id="run-7")
    async with EventProducer(kafka_config.kafka, kafka_config.topics) as producer:
        await producer.send("weights", event)  # keyless records would be refused by the broker
    async with EventConsumer(
        kafka_config.kafka, kafka_config.topics, ["weights"], group_id=None, name="w"
    ) as consumer:
        found: list[ConsumerRecord[bytes, bytes]] = []
        for _ in range(40):
            fetched = await consumer.consumer.getmany(timeout_ms=500)
            found += [record for batch in fetched.values() for record in batch]
            if found:
                break
    [record] = found
    assert record.key == b"run-7"
    assert decode_event(record.value) == event
