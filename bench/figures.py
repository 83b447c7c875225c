"""The figures every side-by-side throughput benchmark reports: medians and their ratio."""

from __future__ import annotations

import statistics


def median_rates(ours: list[float], raw: list[float]) -> dict[str, float]:
    """`events_per_s` and `raw_events_per_s` (medians over rounds) and `ratio` = ours / raw."""
    ours_median, raw_median = statistics.median(ours), statistics.median(raw)
    return {
        "events_per_s": round(ours_median, 1),
        "raw_events_per_s": round(raw_median, 1),
        "ratio": round(ours_median / raw_median, 3),
    }
