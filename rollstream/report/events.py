"""The quick report from a run's events (no SQL store needed): plots (PNG) and one HTML page.

Input is the rollout events of one run (from the topic or the SQL store) plus
figure tables computed elsewhere (tail figures, pool cap waits). Output is
`<out>/timeline.png` (every trajectory as a bar from start to finish, coloured
by outcome, with the moment 90% had finished), `<out>/outcomes.png`,
`<out>/turns.png` and `<out>/index.html` embedding them with the tables.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rollstream.report.pyplot import OUTCOME_COLOURS, plt
from streams.events import Event


@dataclass(frozen=True)
class Span:
    """One trajectory's wall-clock extent and result."""

    trajectory_id: str
    start_s: float
    end_s: float
    outcome: str
    turns: int


def spans_from_events(events: Iterable[Event]) -> list[Span]:
    """Finished trajectories as spans, times relative to the run's first event."""
    started: dict[str, int] = {}
    finished: dict[str, Event] = {}
    for event in events:
        if event.trajectory_id is None:
            continue
        if event.type == "trajectory.started":
            started.setdefault(event.trajectory_id, event.time_ns)
        elif event.type == "trajectory.finished":
            finished[event.trajectory_id] = event
    if not started:
        return []
    origin = min(started.values())
    spans = [
        Span(
            trajectory_id=tid,
            start_s=(started[tid] - origin) / 1e9,
            end_s=(done.time_ns - origin) / 1e9,
            outcome=str(done.data.outcome),  # type: ignore[attr-defined]
            turns=done.data.turns,  # type: ignore[attr-defined]
        )
        for tid, done in finished.items()
        if tid in started
    ]
    return sorted(spans, key=lambda s: (s.start_s, s.trajectory_id))


def _family(outcome: str) -> str:
    return outcome.split(":", 1)[0]


def plot_timeline(spans: list[Span], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(9, max(2.5, 0.12 * len(spans) + 1.5)))
    for row, span in enumerate(spans):
        colour = OUTCOME_COLOURS.get(_family(span.outcome), "#5c6bc0")
        ax.barh(row, span.end_s - span.start_s, left=span.start_s, color=colour, height=0.8)
    if spans:
        # nearest rank (the rule of bench.figures.percentile): the end by which 90% had ended
        p90 = float(np.quantile([s.end_s for s in spans], 0.9, method="inverted_cdf"))
        ax.axvline(p90, color="black", linestyle="--", linewidth=1, label="90% finished")
        ax.legend(loc="lower right")
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("trajectory")
    ax.set_title("Trajectories over time (colour = outcome)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_counts(counts: Mapping[str, int], path: Path, title: str, xlabel: str) -> None:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    labels = list(counts)
    colours = [OUTCOME_COLOURS.get(_family(str(label)), "#5c6bc0") for label in labels]
    ax.bar([str(label) for label in labels], [counts[k] for k in labels], color=colours)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(title: str, rows: Mapping[str, object]) -> str:
    body = "".join(
        f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>" for k, v in rows.items()
    )
    return f"<h2>{html.escape(title)}</h2><table>{body}</table>"


def write_report(
    out: Path, run_id: str, events: list[Event], tables: Mapping[str, Mapping[str, object]]
) -> Path:
    """Write the PNGs and `index.html` into `out`; returns the HTML path."""
    out.mkdir(parents=True, exist_ok=True)
    spans = spans_from_events(events)
    plot_timeline(spans, out / "timeline.png")
    plot_counts(Counter(s.outcome for s in spans), out / "outcomes.png", "Outcomes", "outcome")
    turns = Counter(s.turns for s in spans)
    plot_counts(dict(sorted(turns.items())), out / "turns.png", "Turns per trajectory", "turns")
    sections = "".join(_table(title, rows) for title, rows in tables.items())
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>Rollstream run {html.escape(run_id)}</title>
<style>body{{font-family:sans-serif;max-width:960px;margin:2em auto}}
td{{padding:2px 12px;border-bottom:1px solid #ddd}}img{{max-width:100%}}</style></head><body>
<h1>Run {html.escape(run_id)}</h1>
<p>{len(spans)} trajectories finished, {len(events)} rollout events.</p>
<img src="timeline.png" alt="timeline">
<img src="outcomes.png" alt="outcomes">
<img src="turns.png" alt="turns">
{sections}
</body></html>"""
    path = out / "index.html"
    path.write_text(page)
    return path
