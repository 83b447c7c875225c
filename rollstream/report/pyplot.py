"""matplotlib set up once for every report: the Agg backend (no display needed), imported before
pyplot is, and the outcome colours both the run report and the quick report draw with.

    from rollstream.report.pyplot import OUTCOME_COLOURS, plt
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUTCOME_COLOURS = {
    "resolved": "#2e7d32",
    "unresolved": "#9e9e9e",
    "truncated": "#ef6c00",
    "infra_error": "#c62828",
}

__all__ = ["OUTCOME_COLOURS", "plt"]
