"""Rendering figure state as Prometheus' text exposition format (0.0.4), pure.

`render(totals, windows, settings)` writes every family of `figures.FAMILIES` that
has samples: the cumulative counters and histograms and last-value gauges of
`totals`, per-version reward mean, pass rate and tail share, and for each named
window state (`{"tumbling_60s": state, "hopping_600s": state}`) the window gauges
labelled `window="<name>"`. Families appear once each, with `# HELP` and `# TYPE`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from streams.monitor.figures import (
    FAMILIES,
    LENGTH_CONTROLS,
    PREFIX,
    FigureState,
    bucket_quantile,
    series,
    tail_share,
)
from streams.monitor.settings import MonitorSettings

CONTENT_TYPE = "text/plain; version=0.0.4"
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
_SUFFIXES = ("_bucket", "_sum", "_count")


def parse_series(key: str) -> tuple[str, dict[str, str]]:
    """`rollstream_x{a="1"}` -> ("x", {"a": "1"}) (name without the prefix; values unescaped)."""
    name, _, body = key.partition("{")
    labels = {k: _unescape(v) for k, v in _LABEL.findall(body)}
    return name.removeprefix(PREFIX), labels


def _unescape(value: str) -> str:
    return value.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")


def _family(name: str) -> str:
    if name in FAMILIES:
        return name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name.removesuffix(suffix) in FAMILIES:
            return name.removesuffix(suffix)
    return name


def _order(key: str) -> tuple[str, list[tuple[str, str]], float]:
    """Samples of a series together, histogram buckets by increasing `le`."""
    name, labels = parse_series(key)
    le = labels.pop("le", None)
    return name.removesuffix("_bucket"), sorted(labels.items()), float(le) if le else -1.0


def _value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(totals: FigureState, windows: Mapping[str, FigureState], settings: MonitorSettings) -> str:
    samples: dict[str, list[str]] = {}

    def put(key: str, value: float) -> None:
        samples.setdefault(_family(parse_series(key)[0]), []).append(f"{key} {_value(value)}")

    for key, value in sorted(totals["counters"].items(), key=lambda item: _order(item[0])):
        put(key, value)
    for key, (_, value) in sorted(totals["gauges"].items()):
        put(key, value)
    for key, value in _per_version(totals, settings):
        put(key, value)
    for name, state in windows.items():
        for key, value in window_gauges(state, name):
            put(key, value)
    lines: list[str] = []
    for family, (kind, help_text) in FAMILIES.items():
        if family in samples:
            lines += [f"# HELP {PREFIX}{family} {help_text}", f"# TYPE {PREFIX}{family} {kind}"]
            lines += samples[family]
    return "\n".join(lines) + "\n"


def _by_label(counters: Mapping[str, float], name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, value in counters.items():
        found, labels = parse_series(key)
        if found == name:
            out[labels.get(label, "")] = out.get(labels.get(label, ""), 0.0) + value
    return out


def _per_version(totals: FigureState, settings: MonitorSettings) -> list[tuple[str, float]]:
    counters = totals["counters"]
    scored = _by_label(counters, "scored_trajectories_total", "weight_version")
    resolved = _by_label(counters, "resolved_trajectories_total", "weight_version")
    rewards = _by_label(counters, "reward_sum_total", "weight_version")
    out: list[tuple[str, float]] = []
    known = [version for version in scored if version.isdigit()]  # not the "none" of a token-less one
    for version in sorted(known, key=int)[-settings.versions_kept :]:
        n = scored[version]
        out.append((series("version_reward_mean", weight_version=version), rewards.get(version, 0.0) / n))
        out.append((series("version_pass_rate", weight_version=version), resolved.get(version, 0.0) / n))
    for version, spans in sorted(totals["spans"].items(), key=lambda item: int(item[0])):
        share = tail_share(spans, settings.tail_fraction)
        out.append((series("rollout_tail_share", weight_version=version), share))
    return out


def window_gauges(state: FigureState, window: str) -> list[tuple[str, float]]:
    """The window gauges of one window's state, labelled `window=<name>`."""
    counters = state["counters"]
    outcomes = _by_label(counters, "trajectories_total", "outcome")
    total = sum(outcomes.values())
    out = [(series("window_trajectories", window=window, outcome=o), n) for o, n in sorted(outcomes.items())]
    if total:
        for kind, n in sorted(_by_label(counters, "infra_errors_total", "kind").items()):
            out.append((series("window_infra_error_share", window=window, kind=kind), n / total))
        for control in LENGTH_CONTROLS:
            share = outcomes.get(f"truncated:{control}", 0.0) / total
            out.append((series("window_length_control_share", window=window, control=control), share))
    scored = sum(_by_label(counters, "scored_trajectories_total", "weight_version").values())
    if scored:
        resolved = sum(_by_label(counters, "resolved_trajectories_total", "weight_version").values())
        reward = sum(_by_label(counters, "reward_sum_total", "weight_version").values())
        out += [(series("window_pass_rate", window=window), resolved / scored)]
        out += [(series("window_reward_mean", window=window), reward / scored)]
    for key, n in sorted(counters.items()):
        name, labels = parse_series(key)
        if name == "sandbox_failures_total":
            out.append((series("window_sandbox_failures", window=window, **labels), n))
    buckets = _buckets(counters, "sandbox_start_seconds_bucket")
    if buckets:
        for q in (0.5, 0.99):
            out.append(
                (
                    series("window_sandbox_start_seconds", window=window, quantile=str(q)),
                    bucket_quantile(buckets, q),
                )
            )
    return out


def _buckets(counters: Mapping[str, float], name: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) pairs of a histogram, summed over its other labels."""
    by_le: dict[float, float] = {}
    for key, value in counters.items():
        found, labels = parse_series(key)
        if found == name:
            le = float(labels["le"])
            by_le[le] = by_le.get(le, 0.0) + value
    return sorted(by_le.items())


def summary(text: str) -> dict[str, Any]:
    """Sample name -> value of an exposition (for the CLI's and the bench's own checks)."""
    out: dict[str, Any] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out
