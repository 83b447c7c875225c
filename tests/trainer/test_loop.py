"""The trainer loop: deterministic order across partitions, group intake, and a run on Kafka."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest

from rollstream.config import Config
from streams.bus import EventProducer, read_topic
from streams.eventgen.groups import GroupLogSpec, synthetic_groups
from streams.groups import is_stale
from streams.payloads import GroupFormed, TrajectoryAssembled, WeightsPublished
from tests.trainer.trainer_log import (
    FAST_TRAINER,
    TINY_MODEL,
    invoke_train,
    make_model,
    read_steps,
    settings_args,
)
from trainer.intake import STALE, TRAIN, TrajectoryBuffer, judge_group
from trainer.ordering import Head, PartitionMerger, next_partition
from trainer.versions import directory_sha256


def test_next_partition_waits_for_a_partition_that_may_hold_an_earlier_record() -> None:
    heads = {0: Head(time_ns=20, offset=5), 1: None, 2: Head(time_ns=10, offset=0)}
    assert next_partition(heads, exhausted=set()) is None
    assert next_partition(heads, exhausted={1}) == 2
    tie = {0: Head(time_ns=10, offset=7), 1: Head(time_ns=10, offset=3)}
    assert next_partition(tie, exhausted=()) == 0  # same time: the lower partition first
    assert next_partition({0: None, 1: None}, exhausted={0, 1}) is None


def _records(seed: int) -> dict[int, list[tuple[int, int, str]]]:
    """Per partition (offset, time, name): times rise within a partition, interleave across them."""
    rng = random.Random(seed)
    out: dict[int, list[tuple[int, int, str]]] = {}
    for partition in range(3):
        time_ns = 0
        out[partition] = []
        for offset in range(rng.randrange(2, 8)):
            time_ns += rng.randrange(1, 10)
            out[partition].append((offset, time_ns, f"p{partition}o{offset}"))
    return out


def _merge_all(
    records: dict[int, list[tuple[int, int, str]]], start: dict[int, int], limit: int
) -> list[str]:
    merger: PartitionMerger[str] = PartitionMerger(start)
    for partition, items in records.items():
        for offset, time_ns, name in items:
            if offset >= start[partition]:
                merger.add(partition, offset, time_ns, name)
    taken = []
    while len(taken) < limit and (item := merger.take(exhausted=records)) is not None:
        taken.append(item.item)
    _merge_all.positions = merger.taken_positions()  # type: ignore[attr-defined]
    return taken


@pytest.mark.parametrize("seed", range(5))
def test_merging_again_from_the_taken_positions_continues_the_same_order(seed: int) -> None:
    records = _records(seed)
    start = {p: 0 for p in records}
    whole = _merge_all(records, start, limit=10_000)
    times = {name: (t, p, o) for p, items in records.items() for o, t, name in items}
    assert whole == sorted(whole, key=times.__getitem__)  # (time, partition, offset) order
    assert len(whole) == sum(len(v) for v in records.values())
    first = _merge_all(records, start, limit=len(whole) // 2)
    resumed = _merge_all(records, _merge_all.positions, limit=10_000)  # type: ignore[attr-defined]
    assert first + resumed == whole


def test_the_merger_holds_back_until_a_lagging_partition_is_read() -> None:
    merger: PartitionMerger[str] = PartitionMerger({0: 0, 1: 0})
    merger.add(0, 0, 50, "late")
    assert merger.take(exhausted=()) is None  # partition 1 may still hold something earlier
    merger.add(1, 0, 10, "early")
    assert [merger.take(()).item, merger.take({1}).item] == ["early", "late"]  # type: ignore[union-attr]
    assert merger.taken_positions() == {0: 1, 1: 1}


def test_the_trainer_applies_the_stream_workers_staleness_rule() -> None:
    spec = GroupLogSpec(run_id="r", groups=1)
    group = next(e.data for topic, e in synthetic_groups(spec) if topic == "groups")
    assert isinstance(group, GroupFormed)
    for max_staleness in (-1, 0, 2):
        for version in range(5):
            expected = STALE if is_stale(group.oldest_version, version, max_staleness) else TRAIN
            assert judge_group(group, version, max_staleness) == expected
    assert judge_group(group.model_copy(update={"dropped": "zero_variance"}), 0, 4) == "zero_variance"
    assert is_stale(0, 3, 2) and not is_stale(0, 2, 2) and not is_stale(0, 99, -1)


def test_the_buffer_keeps_the_first_copy_and_knows_the_lowest_offset_still_needed() -> None:
    spec = GroupLogSpec(run_id="r", groups=2, group_size=2)
    data = [e.data for topic, e in synthetic_groups(spec) if topic == "trajectories"]
    assert all(isinstance(d, TrajectoryAssembled) for d in data)
    buffer = TrajectoryBuffer(capacity=3)
    buffer.add("a", 0, 4, data[0])  # type: ignore[arg-type]
    buffer.add("a", 1, 9, data[1])  # type: ignore[arg-type]  # a re-emitted copy: ignored
    buffer.add("b", 1, 2, data[1])  # type: ignore[arg-type]
    assert buffer.lowest_needed({0: 10, 1: 10, 2: 7}) == {0: 4, 1: 2, 2: 7}
    assert buffer.take(["a", "zz"]) == {"a": data[0]}
    assert buffer.missing(["a", "b"]) == ["a"]
    for index, name in enumerate("cde"):
        buffer.add(name, 0, 20 + index, data[0])  # type: ignore[arg-type]
    assert len(buffer) == 3 and buffer.evicted == 1 and buffer.missing(["b"]) == ["b"]  # oldest went


@pytest.mark.parametrize("background", [True, False], ids=["publish-in-background", "publish-in-step"])
def test_a_run_on_kafka_publishes_versions_and_steps(
    config_factory: Callable[..., Config], background: bool
) -> None:
    overrides = (
        *TINY_MODEL,
        *FAST_TRAINER,
        "trainer.groups_per_step=3",
        "policy.max_staleness=-1",
        f"trainer.publish_in_background={str(background).lower()}",
    )
    cfg = config_factory(*overrides)
    make_model(cfg)
    spec = GroupLogSpec(run_id="loop", groups=8, vocab_size=300, zero_variance_every=4, versions_per_group=0)

    async def write_groups_before_their_trajectories() -> None:
        records = synthetic_groups(spec)
        async with EventProducer(cfg.kafka, cfg.topics) as producer:
            for topic, event in sorted(records, key=lambda r: r[0] != "groups"):
                await producer.send(topic, event)

    asyncio.run(write_groups_before_their_trajectories())
    config_args = (
        f'kafka.bootstrap="{cfg.kafka.bootstrap}"',
        f'topics.prefix="{cfg.topics.prefix}"',
        f'run.state_dir="{cfg.run.state_dir}"',
        *overrides,
    )
    result = invoke_train("--run", "loop", "--steps", "2", *settings_args(*config_args))
    assert result.exit_code == 0, result.output

    history = asyncio.run(read_topic(cfg.kafka, cfg.topics, "weights.history"))
    published = [r.event.data for r in history]
    assert [p.version for p in published] == [1, 2]  # type: ignore[attr-defined]
    for data in published:
        assert isinstance(data, WeightsPublished)
        assert directory_sha256(data.path) == data.checksum  # type: ignore[arg-type]
    latest = asyncio.run(read_topic(cfg.kafka, cfg.topics, "weights"))
    assert latest[-1].event.key == b"loop" and latest[-1].event.data.version == 2  # type: ignore[attr-defined]

    steps = [r.event.data for r in read_steps(cfg)]
    kept = [e.group_id for t, e in synthetic_groups(spec) if t == "groups" and not e.data.dropped]  # type: ignore[attr-defined]
    assert [g for s in steps for g in s.group_ids] == kept[:6]  # type: ignore[attr-defined]
    first = steps[0]
    assert first.zero_variance_groups == 0 and steps[1].zero_variance_groups == 1  # type: ignore[attr-defined]
    assert first.trajectories == 3 * spec.group_size  # type: ignore[attr-defined]
    assert first.tokens == 3 * spec.group_size * (spec.prompt_tokens + spec.output_tokens)  # type: ignore[attr-defined]
    assert first.mean_logprob_diff > 0 and 0 < first.ess <= 1 and first.grad_norm > 0  # type: ignore[attr-defined]
    assert first.times.update_s > 0 and first.times.publish_s > 0  # type: ignore[attr-defined]
    announced = {r.event.data.version: r.event.time_ns for r in history}  # type: ignore[attr-defined]
    for record in read_steps(cfg):  # in the background or not, a step's event follows its version's
        data, times = record.event.data, record.event.data.times  # type: ignore[attr-defined]
        assert announced[data.version] <= record.event.time_ns  # type: ignore[attr-defined]
        assert (times.publish_background_s > 0) == background  # in the step: its time, not beside it
        parts = times.wait_s + times.logprob_s + times.update_s + times.publish_s
        assert times.total_s == pytest.approx(parts)
    for step in steps:  # what the waits were for: its groups were there, their trajectories read after
        times = step.times  # type: ignore[attr-defined]
        assert times.wait_trajectories_s > 0
        # the machine's CPU use is counted in 10 ms ticks: a shorter wait may not have seen one
        assert times.wait_cpu_busy is not None or times.wait_s < 0.05
        assert times.wait_groups_s + times.wait_trajectories_s <= times.wait_s
    assert (first.staleness_max, steps[1].staleness_max, steps[1].staleness_mean) == (0, 1, 1.0)  # type: ignore[attr-defined]
