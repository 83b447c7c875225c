"""The figures every benchmark reports: medians and their ratio, and percentiles.

Percentiles follow one rule everywhere in bench/: nearest rank, i.e. numpy's
`inverted_cdf` method, the smallest measured value with at least the fraction `q`
of the values at or below it (always a value that was measured, never an
interpolation between two).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q`-quantile of `values` (`q` in [0, 1]: 0.5 the median, 0.99 the p99)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"percentile q={q} is outside [0, 1]; pass a fraction (0.99 for p99)")
    if len(values) == 0:
        raise ValueError("percentile of no values: measure at least one")
    return float(np.quantile(np.asarray(values, dtype=float), q, method="inverted_cdf"))


def median_rates(ours: list[float], raw: list[float]) -> dict[str, float]:
    """`events_per_s` and `raw_events_per_s` (medians over rounds) and `ratio` = ours / raw."""
    ours_median, raw_median = statistics.median(ours), statistics.median(raw)
    return {
        "events_per_s": round(ours_median, 1),
        "raw_events_per_s": round(raw_median, 1),
        "ratio": round(ours_median / raw_median, 3),
    }
