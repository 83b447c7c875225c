"""Drawing: one `figures.Figure` -> one PNG (matplotlib, Agg backend, no display needed).

A figure without points is drawn as a "no data" panel that names the reason, so
an eval-only run's trainer figures say why they are blank instead of showing
empty axes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.ticker import MaxNLocator

from rollstream.report.figures import Figure, family
from rollstream.report.pyplot import OUTCOME_COLOURS, plt
from rollstream.report.settings import ReportSettings

PALETTE = ("#3949ab", "#00897b", "#f9a825", "#8e24aa", "#6d4c41", "#e53935", "#757575")
LINE_STYLES: tuple[dict[str, Any], ...] = (
    {"marker": "o", "markersize": 5, "linestyle": "-"},
    {"marker": "s", "markersize": 4, "linestyle": "--"},
    {"marker": "^", "markersize": 4, "linestyle": ":"},
)  # series that coincide (pass@1 and a 0/1 reward) stay visible
MAX_CATEGORY_TICKS = 30


def plot(figure: Figure, path: Path, settings: ReportSettings) -> Path:
    """Write `figure` as a PNG at `path`; returns `path`."""
    fig, ax = plt.subplots(figsize=(settings.figure_width_in, settings.figure_height_in))
    try:
        if figure.points == 0:
            _no_data(ax, figure)
        else:
            DRAW[figure.kind](ax, figure)
            ax.set_xlabel(figure.xlabel)
            ax.set_ylabel(figure.ylabel)
        title = (
            figure.title if not figure.notes or figure.points == 0 else f"{figure.title}\n{figure.notes[0]}"
        )
        ax.set_title(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=settings.dpi)
    finally:
        plt.close(fig)
    return path


def _no_data(ax: Any, figure: Figure) -> None:
    ax.text(0.5, 0.5, f"no data: {figure.empty_reason}", ha="center", va="center", fontsize=12, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])
    for spine in ax.spines.values():
        spine.set_linestyle("--")
        spine.set_color("#bbb")


def _bars(ax: Any, figure: Figure) -> None:
    series = figure.series[0]
    colours = [OUTCOME_COLOURS.get(family(c), PALETTE[0]) for c in figure.categories]
    bars = ax.bar(series.x, series.y, color=colours, yerr=series.errors or None, capsize=4)
    share = series.label == "share"
    ax.bar_label(bars, labels=[f"{v:.0%}" if share else f"{v:g}" for v in series.y], fontsize=8)
    _category_ticks(ax, figure.categories)


def _stacked(ax: Any, figure: Figure) -> None:
    bottom = [0.0] * len(figure.categories)
    for index, series in enumerate(figure.series):
        if not any(series.y):
            continue
        ax.bar(series.x, series.y, bottom=bottom, label=series.label, color=PALETTE[index % len(PALETTE)])
        bottom = [b + v for b, v in zip(bottom, series.y, strict=True)]
    _category_ticks(ax, figure.categories)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _hist(ax: Any, figure: Figure) -> None:
    series = figure.series[0]
    ax.bar(series.x, series.y, width=figure.bin_width * 0.9, color=PALETTE[0])


def _lines(ax: Any, figure: Figure) -> None:
    right = ax.twinx() if any(s.axis == 1 for s in figure.series) else None
    handles = []
    for index, series in enumerate(figure.series):
        target = right if series.axis == 1 and right is not None else ax
        colour, style = PALETTE[index % len(PALETTE)], LINE_STYLES[index % len(LINE_STYLES)]
        (line,) = target.plot(series.x, series.y, color=colour, label=series.label, **style)
        handles.append(line)
    if right is not None:
        right.set_ylabel(figure.ylabel_right)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # versions and steps are whole numbers
    ax.legend(handles=handles, fontsize=8, loc="best")


def _curve(ax: Any, figure: Figure) -> None:
    series = figure.series[0]
    ax.step(series.x, series.y, where="post", color=PALETTE[0], label=series.label)
    for label, x in figure.marks:
        ax.axvline(x, color="black", linestyle="--", linewidth=1, label=label)
        ax.axvspan(x, max(series.x), color="#ef6c00", alpha=0.12)
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=8, loc="lower right")


def _category_ticks(ax: Any, categories: list[str]) -> None:
    step = max(1, -(-len(categories) // MAX_CATEGORY_TICKS))
    ticks = list(range(0, len(categories), step))
    ax.set_xticks(
        ticks, [categories[i] for i in ticks], rotation=20 if len(categories) > 4 else 0, fontsize=8
    )


DRAW = {"bars": _bars, "stacked": _stacked, "hist": _hist, "lines": _lines, "curve": _curve}
