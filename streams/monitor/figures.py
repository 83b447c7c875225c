"""The monitor's figures, pure: folding a record into figure state, rendering the exposition.

A record of a derived topic (decoded envelope as a dict) becomes an `Update`:
counter increments, gauge values and, for trajectories, the (start, finish) span
per weight version. `FigureState` is a JSON-friendly dict (what faust tables hold):

    {"offset": last source offset applied, "counters": {series: value},
     "gauges": {series: [time_ns, value]}, "spans": {version: [[start_s, end_s], ...]}}

Series keys are Prometheus sample names with labels, `name{a="x",b="y"}` (labels
sorted), so rendering is text assembly. `apply` is idempotent per source
partition: an update at an offset at or below `offset` is ignored, which is what
makes state recovered from a changelog exact after a replay of the same records.
`merge` sums partitions (counters), keeps the newest gauge value and joins spans.
`render` writes the text exposition (format 0.0.4): cumulative counters and
histograms, gauges, and window gauges derived from the windowed states.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams.monitor.settings import MonitorSettings

FigureState = dict[str, Any]
NS = 1e9
PREFIX = "rollstream_"
LENGTH_CONTROLS = ("turns", "tokens", "context", "deadline", "time")
PHASES = ("wait", "logprob", "update", "publish")

# family -> (type, help); histogram families render _bucket/_sum/_count
FAMILIES: dict[str, tuple[str, str]] = {
    "monitor_records_total": ("counter", "Records the monitor folded, by source topic."),
    "trajectories_total": ("counter", "Trajectories finished, by outcome."),
    "infra_errors_total": ("counter", "Trajectories ended by an infrastructure error, by kind."),
    "scored_trajectories_total": ("counter", "Scored trajectories, by the weight version they ran under."),
    "resolved_trajectories_total": ("counter", "Resolved trajectories, by weight version."),
    "reward_sum_total": ("counter", "Sum of rewards of scored trajectories, by weight version."),
    "trajectory_duration_seconds": ("histogram", "Wall time of a trajectory."),
    "trajectory_queue_seconds": ("histogram", "Queue wait of a trajectory (engine and sandbox queues)."),
    "groups_total": ("counter", "GRPO groups formed, by status (kept or the drop reason)."),
    "sandbox_requests_total": ("counter", "Sandboxes requested, by backend."),
    "sandbox_failures_total": ("counter", "Sandbox failures, by backend and error kind."),
    "sandbox_start_seconds": ("histogram", "Sandbox start time, by backend."),
    "sandbox_queue_wait_seconds": ("histogram", "Wait on the sandbox pool's caps, by backend."),
    "sandbox_cap_wait_seconds_total": ("counter", "Seconds sandbox requests waited on each pool cap."),
    "sandbox_cap_waits_total": ("counter", "Sandbox requests that waited on each pool cap."),
    "trainer_steps_total": ("counter", "Trainer optimiser steps."),
    "trainer_step_phase_seconds_total": ("counter", "Trainer step time, by phase."),
    "trainer_step_seconds": ("histogram", "Trainer step wall time."),
    "weight_versions_published_total": ("counter", "Weight versions published."),
    "trainer_step": ("gauge", "Last trainer step."),
    "trainer_grad_norm": ("gauge", "Global grad norm of the last step, before clipping."),
    "trainer_logprob_diff": ("gauge", "Mean |logprob(trainer) - logprob(engine)| of the last step."),
    "trainer_ess": ("gauge", "Token-level importance-weight ESS of the last step."),
    "trainer_loss": ("gauge", "Loss of the last step."),
    "trainer_staleness_mean": ("gauge", "Mean staleness (versions) of the last step's trajectories."),
    "trainer_staleness_max": ("gauge", "Max staleness (versions) of the last step's trajectories."),
    "weight_version": ("gauge", "Newest published weight version."),
    "rollout_tail_share": ("gauge", "Share of a version's rollout time after the tail fraction finished."),
    "version_reward_mean": ("gauge", "Mean reward of scored trajectories, by weight version."),
    "version_pass_rate": ("gauge", "Resolved / scored trajectories, by weight version."),
    "window_trajectories": ("gauge", "Trajectories finished in the current window, by outcome."),
    "window_infra_error_share": ("gauge", "Infra errors / trajectories in the window, by kind."),
    "window_length_control_share": ("gauge", "Truncated / trajectories in the window, by length control."),
    "window_pass_rate": ("gauge", "Resolved / scored trajectories in the window."),
    "window_reward_mean": ("gauge", "Mean reward of scored trajectories in the window."),
    "window_sandbox_failures": ("gauge", "Sandbox failures in the window, by backend and kind."),
    "window_sandbox_start_seconds": ("gauge", "Sandbox start time quantiles in the window (from buckets)."),
}


@dataclass
class Update:
    """What one record changes: counter increments, gauge values (at `time_ns`), a span."""

    time_ns: int = 0
    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    span: tuple[int, float, float] | None = None  # (weight version, start s, finish s)

    def add(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = series(name, **labels)
        self.counters[key] = self.counters.get(key, 0.0) + value

    def observe(self, name: str, value: float, buckets: tuple[float, ...], **labels: str) -> None:
        """One histogram observation: cumulative buckets, sum and count."""
        for bound in (*buckets, math.inf):
            if value <= bound:
                self.add(f"{name}_bucket", 1.0, **labels, le=_fmt(bound))
        self.add(f"{name}_sum", value, **labels)
        self.add(f"{name}_count", 1.0, **labels)


def series(name: str, **labels: str) -> str:
    if not labels:
        return PREFIX + name
    body = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
    return f"{PREFIX}{name}{{{body}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value)) if value != int(value) else f"{int(value)}.0"


# ---- records -> updates ---------------------------------------------------------------


def record_update(topic: str, envelope: Mapping[str, Any], settings: MonitorSettings) -> Update:
    """The update one record of `topic` (short name) causes; unknown types change nothing."""
    update = Update(time_ns=int(envelope.get("time_ns") or 0))
    update.add("monitor_records_total", topic=topic)
    data = envelope.get("data") or {}
    kind = envelope.get("type")
    buckets = settings.latency_buckets_s
    if kind == "trajectory.assembled":
        version = envelope.get("policy_version")  # None: the trajectory generated no token
        _trajectory(update, data, None if version is None else int(version), buckets)
    elif kind == "group.formed":
        update.add("groups_total", status=data.get("dropped") or "kept")
    elif kind == "trainer.step":
        _trainer_step(update, data, buckets)
    elif kind == "weights.published":
        update.add("weight_versions_published_total")
        update.gauges[series("weight_version")] = float(data.get("version", 0))
    elif kind in ("sandbox.requested", "sandbox.ready", "sandbox.failed"):
        _sandbox(update, kind, data, buckets)
    return update


UNKNOWN_VERSION = "none"  # the `weight_version` label of a scored trajectory that generated no token


def _trajectory(
    update: Update, data: Mapping[str, Any], version: int | None, buckets: tuple[float, ...]
) -> None:
    outcome = str(data.get("outcome", ""))
    update.add("trajectories_total", outcome=outcome)
    if outcome.startswith("infra_error:"):
        update.add("infra_errors_total", kind=outcome.partition(":")[2])
    elif data.get("reward") is not None:
        label = UNKNOWN_VERSION if version is None else str(version)
        update.add("scored_trajectories_total", weight_version=label)
        update.add("reward_sum_total", float(data["reward"]), weight_version=label)
        if outcome == "resolved":
            update.add("resolved_trajectories_total", weight_version=label)
    times = data.get("times") or {}
    total_s = float(times.get("total_s", 0.0))
    update.observe("trajectory_duration_seconds", total_s, buckets)
    update.observe("trajectory_queue_seconds", float(times.get("queue_s", 0.0)), buckets)
    finish_s = update.time_ns / NS
    if version is not None:
        update.span = (version, finish_s - total_s, finish_s)


def _trainer_step(update: Update, data: Mapping[str, Any], buckets: tuple[float, ...]) -> None:
    update.add("trainer_steps_total")
    times = data.get("times") or {}
    for phase in PHASES:
        update.add("trainer_step_phase_seconds_total", float(times.get(f"{phase}_s", 0.0)), phase=phase)
    update.observe("trainer_step_seconds", float(times.get("total_s", 0.0)), buckets)
    for name, key in (
        ("trainer_step", "step"),
        ("trainer_grad_norm", "grad_norm"),
        ("trainer_logprob_diff", "mean_logprob_diff"),
        ("trainer_ess", "ess"),
        ("trainer_loss", "loss"),
        ("trainer_staleness_mean", "staleness_mean"),
        ("trainer_staleness_max", "staleness_max"),
    ):
        if key in data:
            update.gauges[series(name)] = float(data[key])


def _sandbox(update: Update, kind: str, data: Mapping[str, Any], buckets: tuple[float, ...]) -> None:
    backend = str(data.get("backend", ""))
    if kind == "sandbox.requested":
        update.add("sandbox_requests_total", backend=backend)
    elif kind == "sandbox.ready":
        update.observe("sandbox_start_seconds", float(data.get("start_s", 0.0)), buckets, backend=backend)
        update.observe(
            "sandbox_queue_wait_seconds", float(data.get("queue_wait_s", 0.0)), buckets, backend=backend
        )
        for cap, waited in (data.get("cap_waits") or {}).items():
            update.add("sandbox_cap_wait_seconds_total", float(waited), backend=backend, cap=str(cap))
            update.add("sandbox_cap_waits_total", 1.0, backend=backend, cap=str(cap))
    else:
        update.add("sandbox_failures_total", backend=backend, kind=str(data.get("error_kind", "")))


# ---- state ----------------------------------------------------------------------------


def empty_state() -> FigureState:
    return {"offset": -1, "counters": {}, "gauges": {}, "spans": {}}


def fold_all(
    state: FigureState | None, pairs: list[tuple[Update, int]], kept: tuple[int, int]
) -> FigureState:
    """`state` with each (update, offset) folded in, in order, skipping offsets at or below the
    state's; `kept` = (versions kept, spans kept per version; later trajectories of a version are
    left out of its tail share). The input state is not changed."""
    state = state or empty_state()
    fresh = [(u, o) for u, o in pairs if o > state["offset"]]
    if not fresh:
        return state
    counters, gauges = dict(state["counters"]), dict(state["gauges"])
    spans = {v: list(s) for v, s in state["spans"].items()}
    offset = state["offset"]
    for update, at in fresh:
        if at <= offset:
            continue
        offset = at
        for key, value in update.counters.items():
            counters[key] = counters.get(key, 0.0) + value
        for key, value in update.gauges.items():
            if key not in gauges or gauges[key][0] <= update.time_ns:
                gauges[key] = [update.time_ns, value]
        if update.span is not None:
            version, start, finish = update.span
            kept_spans = spans.setdefault(str(version), [])
            if len(kept_spans) < kept[1]:
                kept_spans.append([start, finish])
    return {"offset": offset, "counters": counters, "gauges": gauges, "spans": _newest(spans, kept[0])}


def counters_only(update: Update) -> Update:
    """What window tables keep: the counters (gauges and spans are not windowed)."""
    return Update(time_ns=update.time_ns, counters=update.counters)


def apply(
    state: FigureState | None, update: Update, offset: int, versions_kept: int, spans_kept: int = 4096
) -> FigureState:
    """`fold_all` of one update: unchanged when `offset` is at or below the state's."""
    return fold_all(state, [(update, offset)], (versions_kept, spans_kept))


def _newest(spans: dict[str, Any], kept: int) -> dict[str, Any]:
    return {v: spans[v] for v in sorted(spans, key=int)[-kept:]}


def merge(states: Iterable[FigureState], versions_kept: int) -> FigureState:
    """One state from many partitions' (offset is meaningless in the result)."""
    merged = empty_state()
    for state in states:
        for key, value in state["counters"].items():
            merged["counters"][key] = merged["counters"].get(key, 0.0) + value
        for key, (time_ns, value) in state["gauges"].items():
            if key not in merged["gauges"] or merged["gauges"][key][0] <= time_ns:
                merged["gauges"][key] = [time_ns, value]
        for version, spans in state["spans"].items():
            merged["spans"].setdefault(version, []).extend(spans)
    merged["spans"] = _newest(merged["spans"], versions_kept)
    return merged


def tail_share(spans: list[list[float]], fraction: float) -> float:
    """Share of the rollout's time (first start to last finish) after `fraction` of it finished."""
    if not spans:
        return 0.0
    finishes = sorted(s[1] for s in spans)
    start, end = min(s[0] for s in spans), finishes[-1]
    if end <= start:
        return 0.0
    at = finishes[max(0, math.ceil(fraction * len(finishes)) - 1)]
    return (end - at) / (end - start)


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """`histogram_quantile` over cumulative (upper bound, count) pairs, as Prometheus computes it."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    index = bisect.bisect_left([count for _, count in buckets], rank)
    bound, count = buckets[index]
    if math.isinf(bound):
        return buckets[-2][0] if len(buckets) > 1 else math.nan
    lower, below = (0.0, 0.0) if index == 0 else buckets[index - 1]
    if count == below:
        return bound
    return lower + (bound - lower) * (rank - below) / (count - below)
