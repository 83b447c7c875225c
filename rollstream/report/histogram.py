"""Histogram bins of the report's figures (pure numpy): whole-number bins for counts such as turns."""

from __future__ import annotations

import numpy as np


def histogram(
    values: list[float], weights: list[float], max_bins: int, *, integer: bool
) -> tuple[list[float], list[float], float]:
    """(bin centres, weighted counts, bin width); integer values get whole-number bins."""
    if not values:
        return [], [], 1.0
    low, high = min(values), max(values)
    if integer:
        width = float(max(1, int(np.ceil((high - low + 1) / max_bins))))
        edges = np.arange(low - 0.5, high + 0.5 + width, width)
    else:
        span = high - low
        width = span / max_bins if span > 0 else max(abs(high) * 0.1, 1e-3)
        edges = (
            np.arange(max_bins + 1) * width + low
            if span > 0
            else np.array([low - width / 2, low + width / 2])
        )
    counts, edges = np.histogram(values, bins=edges, weights=weights)
    centres = (edges[:-1] + edges[1:]) / 2
    return [float(c) for c in centres], [float(c) for c in counts], float(width)
