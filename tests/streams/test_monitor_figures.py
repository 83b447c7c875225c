"""The monitor's pure parts: records folded into figure state, the exposition, the lifecycle copy.

Records come from the real stream processor fed by the event generator, encoded and
decoded as on the wire; the exposition is read back with `prometheus_client`'s parser.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter

from prometheus_client.parser import text_string_to_metric_families

from streams.eventgen import AttemptSpec, group_events, random_attempts
from streams.events import Event, encode_event, make_event
from streams.lifecycle import LifecycleBuffer
from streams.monitor.exposition import parse_series, render, window_gauges
from streams.monitor.figures import (
    Update,
    apply,
    bucket_quantile,
    counters_only,
    empty_state,
    fold_all,
    merge,
    record_update,
    series,
    tail_share,
)
from streams.monitor.settings import MonitorSettings
from streams.outcomes import Outcome
from streams.payloads import SandboxReady, StepTimes, TrainerStep
from streams.processor import Emit, StreamProcessor
from streams.settings import PolicySettings

SETTINGS = MonitorSettings()


def _derived(groups: int = 12, seed: int = 5) -> list[Emit]:
    """What the stream worker writes for a run: trajectories, groups and sandbox lifecycle copies."""
    rng = random.Random(seed)
    processor, buffer = StreamProcessor(PolicySettings()), LifecycleBuffer()
    out: list[Emit] = []
    for g in range(groups):
        for event in group_events("run-f", f"run-f/g{g}", random_attempts(rng, 4, infra_rate=0.25)):
            buffer.observe(event, processor.groups)
            out += [o for o in buffer.release(processor.feed(event)) if isinstance(o, Emit)]
    return out


def _fold(emits: list[Emit], partitions: int = 3) -> dict[str, dict]:
    states: dict[str, dict] = {}
    for offset, emit in enumerate(emits):
        envelope = json.loads(encode_event(emit.event))
        key = f"{emit.topic}:{offset % partitions}"
        states[key] = apply(states.get(key), record_update(emit.topic, envelope, SETTINGS), offset, 20)
    return states


def _families(text: str) -> dict[str, list]:
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def test_trajectory_counters_match_the_folded_trajectories_and_parse() -> None:
    emits = _derived()
    trajectories = [e.event.data for e in emits if e.topic == "trajectories"]
    outcomes = Counter(str(t.outcome) for t in trajectories)
    assert any(o.startswith("infra_error:") for o in outcomes)
    totals = merge(_fold(emits).values(), 20)
    families = _families(render(totals, {"tumbling_60s": totals}, SETTINGS))
    samples = families["rollstream_trajectories"]
    counted = {s.labels["outcome"]: s.value for s in samples if s.name.endswith("_total")}
    assert counted == {k: float(v) for k, v in outcomes.items()}
    infra = {s.labels["kind"]: s.value for s in families["rollstream_infra_errors"]}
    injected = {k.partition(":")[2]: float(v) for k, v in outcomes.items() if k.startswith("infra_error:")}
    assert infra == injected
    failures = sum(s.value for s in families["rollstream_sandbox_failures"])
    assert failures == sum(infra.values())  # every generated infra error is a sandbox failure
    starts = [s for s in families["rollstream_sandbox_start_seconds"] if s.name.endswith("_count")]
    assert starts[0].value == len(trajectories) - failures
    buckets = [s for s in families["rollstream_sandbox_start_seconds"] if s.name.endswith("_bucket")]
    assert [float(s.labels["le"]) for s in buckets] == sorted(float(s.labels["le"]) for s in buckets)
    window = {s.labels["outcome"]: s.value for s in families["rollstream_window_trajectories"]}
    assert window == counted


def test_apply_ignores_records_at_or_below_the_applied_offset() -> None:
    emits = _derived(groups=3)
    once = _fold(emits)
    again = dict(once)
    for offset, emit in enumerate(emits):  # a replay after a crash: the same records at the same offsets
        key = f"{emit.topic}:{offset % 3}"
        update = record_update(emit.topic, json.loads(encode_event(emit.event)), SETTINGS)
        again[key] = apply(again[key], update, offset, 20)
    assert again == once
    assert json.loads(json.dumps(once)) == once  # what the changelog stores comes back equal


def test_fold_all_equals_record_by_record_and_caps_spans() -> None:
    emits = _derived(groups=4)
    envelopes = [(e.topic, json.loads(encode_event(e.event))) for e in emits]
    pairs = [(record_update(topic, envelope, SETTINGS), i) for i, (topic, envelope) in enumerate(envelopes)]
    one_by_one = empty_state()
    for update, offset in pairs:
        one_by_one = apply(one_by_one, update, offset, 20)
    assert fold_all(None, pairs, (20, 4096)) == one_by_one
    assert fold_all(fold_all(None, pairs[:7], (20, 4096)), pairs, (20, 4096)) == one_by_one  # overlap skipped
    capped = fold_all(None, pairs, (20, 3))
    assert [len(spans) for spans in capped["spans"].values()] == [3]
    assert capped["counters"] == one_by_one["counters"]
    windowed = fold_all(None, [(counters_only(u), o) for u, o in pairs], (20, 3))
    assert windowed["counters"] == one_by_one["counters"] and not windowed["spans"] and not windowed["gauges"]


def test_gauges_keep_the_newest_value_across_partitions() -> None:
    def step(n: int, grad: float) -> dict:
        times = StepTimes(wait_s=1, logprob_s=2, update_s=3, publish_s=4, total_s=10)
        data = TrainerStep(
            step=n, version=n + 1, groups=1, trajectories=8, loss=0.1, grad_norm=grad, times=times
        )
        event = make_event(data, run_id="r", seq=n, time_ns=(100 + n) * 10**9, source="trainer")
        return json.loads(encode_event(event))

    late = apply(None, record_update("trainer.steps", step(2, 0.5), SETTINGS), 0, 20)
    early = apply(None, record_update("trainer.steps", step(1, 0.9), SETTINGS), 0, 20)
    merged = merge([late, early], 20)
    assert merged["gauges"][series("trainer_grad_norm")][1] == 0.5
    assert merged["counters"][series("trainer_step_phase_seconds_total", phase="update")] == 6.0
    assert merged["counters"][series("trainer_steps_total")] == 2.0


def test_cap_waits_are_counted_per_cap() -> None:
    ready = SandboxReady(
        backend="docker",
        sandbox_id="s",
        queue_wait_s=3.0,
        start_s=1.0,
        cap_waits={"max_running": 2.0, "image_pulls": 1.0},
    )
    event = make_event(ready, run_id="r", seq=2, time_ns=10**18, source="w", group_id="g", trajectory_id="t")
    state = apply(None, record_update("sandbox.lifecycle", json.loads(encode_event(event)), SETTINGS), 0, 20)
    families = _families(render(state, {}, SETTINGS))
    waited = {s.labels["cap"]: s.value for s in families["rollstream_sandbox_cap_wait_seconds"]}
    assert waited == {"max_running": 2.0, "image_pulls": 1.0}
    assert {s.labels["cap"]: s.value for s in families["rollstream_sandbox_cap_waits"]} == {
        "max_running": 1.0,
        "image_pulls": 1.0,
    }


def test_tail_share_and_quantiles() -> None:
    spans = [[0.0, float(i)] for i in range(1, 11)]
    assert math.isclose(tail_share(spans, 0.9), 0.1)
    assert tail_share([], 0.9) == 0.0
    assert math.isclose(tail_share([[0, 1]] * 9 + [[0, 100]], 0.9), 0.99)
    buckets = [(1.0, 50.0), (2.0, 100.0), (math.inf, 100.0)]
    assert math.isclose(bucket_quantile(buckets, 0.5), 1.0)
    assert math.isclose(bucket_quantile(buckets, 0.75), 1.5)
    assert math.isnan(bucket_quantile([], 0.5))


def test_window_gauges_give_shares_by_length_control() -> None:
    update = Update()
    for outcome, n in (("truncated:turns", 3), ("resolved", 1)):
        update.add("trajectories_total", n, outcome=outcome)
    gauges = dict(window_gauges(apply(None, update, 0, 20), "w"))
    assert gauges[series("window_length_control_share", window="w", control="turns")] == 0.75
    assert gauges[series("window_length_control_share", window="w", control="tokens")] == 0.0
    assert parse_series(series("x", a='q"\n\\')) == ("x", {"a": 'q"\n\\'})


def test_lifecycle_copies_each_sandbox_event_once_before_its_trajectory() -> None:
    specs = [
        AttemptSpec(0, group_size=3),
        AttemptSpec(1, outcome=Outcome.INFRA_SANDBOX_START, reward=None, group_size=3),
        AttemptSpec(1, retry=1, group_size=3),
    ]
    events = group_events("run-l", "run-l/g0", specs)
    events = [*events, *group_events("run-l", "run-l/g1", [AttemptSpec(0, group_size=2)])]  # never forms
    processor, buffer = StreamProcessor(PolicySettings()), LifecycleBuffer()
    out: list[Emit] = []
    for event in [*events, *events]:  # the second pass is a re-read after a restart
        buffer.observe(event, processor.groups)
        out += [o for o in buffer.release(processor.feed(event)) if isinstance(o, Emit)]
    copies: list[Event] = [o.event for o in out if o.topic == "sandbox.lifecycle"]
    assert sorted(e.id for e in copies) == sorted(e.id for e in events if e.type.startswith("sandbox."))
    first = {o.event.trajectory_id: i for i, o in reversed(list(enumerate(out)))}
    folded = {o.event.trajectory_id: i for i, o in enumerate(out) if o.topic == "trajectories"}
    assert all(first[t] < folded[t] for t in folded) and len(folded) == 4
    assert len(buffer) == 0  # released at fold; re-read events of folded trajectories are not kept
    assert empty_state()["offset"] == -1
