"""From the store's rows to figure data (pure: no SQL, no plotting, no clock).

Each function takes rows from `queries` and returns a `Figure`: what to draw
(categorical bars, stacked bars, histogram, lines, a step curve), its series, vertical
marks and notes, and `points`, how many data points it draws. `points == 0` means the
run has no data for that figure; `plots` then draws a "no data" panel saying why
(`empty_reason`) instead of empty axes, and the page exposes `points` per figure.

The long-tail figure uses `streams.tail` (the tail share and the 90% mark), so the
report and `rollstream tail` agree on the definition.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from rollstream.report.histogram import histogram
from rollstream.report.queries import (
    INFRA_PREFIX,
    TRAJECTORY_PARTS,
    EvalRow,
    RunRows,
    StepRow,
    TimeRow,
    VersionRow,
)
from rollstream.report.settings import ReportSettings
from streams.tail import finished_mark, tail_share
from trainer.waits import mean_in_flight, summarise_waits, wait_reason

NS = 1e9
PART_LABELS = {
    "llm_s": "llm",
    "tool_s": "tools",
    "sandbox_start_s": "sandbox start",
    "agent_install_s": "agent install",
    "tests_s": "tests",
    "queue_s": "queue (caps)",
}
STEP_PARTS = {
    "wait_groups_s": "wait: no group formed yet",
    "wait_trajectories_s": "wait: trajectories not read",
    "wait_other_s": "wait: reading, judging",  # wait_s less the two (all of it in old records)
    "logprob_s": "logprob",
    "update_s": "update",
    "publish_s": "publish",
}
FAMILY_ORDER = ("resolved", "unresolved", "truncated", "infra_error")


@dataclass(frozen=True)
class Series:
    label: str
    x: list[float]  # category index for bars/stacked, value for lines/curve/hist (bin centre)
    y: list[float]
    axis: int = 0  # 1: the right-hand axis (lines)
    errors: list[float] = field(default_factory=list)  # error bars (bars), one per value


@dataclass(frozen=True)
class Figure:
    key: str  # file name and the page's data-figure attribute
    title: str
    kind: str  # "bars" | "stacked" | "hist" | "lines" | "curve"
    xlabel: str
    ylabel: str
    series: list[Series]
    points: int
    empty_reason: str
    categories: list[str] = field(default_factory=list)
    marks: list[tuple[str, float]] = field(default_factory=list)  # (label, x) vertical lines
    notes: list[str] = field(default_factory=list)
    ylabel_right: str = ""
    bin_width: float = 1.0


def family(outcome: str) -> str:
    return outcome.split(":", 1)[0]


def pass1_by_version(versions: list[VersionRow]) -> Figure:
    scored = [v for v in versions if v.scored > 0 and v.version is not None]
    x = [float(v.version) for v in scored if v.version is not None]
    rewards = [
        (float(v.version), v.reward_mean)
        for v in scored
        if v.version is not None and v.reward_mean is not None
    ]
    infra = sum(v.infra_errors for v in versions)
    attempts = sum(v.scored for v in scored)
    notes = [f"{attempts} scored attempts; {infra} infrastructure errors not scored"]
    tokenless = sum(v.scored for v in versions if v.version is None)
    if tokenless:
        notes.append(f"{tokenless} scored attempts generated no token (no version)")
    return Figure(
        key="pass1_by_version",
        title="pass@1 and mean reward by weight version",
        kind="lines",
        xlabel="weight version (of the trajectory's first token)",
        ylabel="pass@1 / mean reward",
        series=[
            Series("pass@1", x, [v.resolved / v.scored for v in scored]),
            Series("mean reward (verifier)", [r[0] for r in rewards], [float(r[1]) for r in rewards]),
        ],
        points=len(scored),
        empty_reason="no scored trajectories",
        notes=notes,
    )


def heldout_pass1(evaluations: list[EvalRow]) -> Figure:
    """pass@1 of each evaluated model (base, SFT, RL, or before/after), by weight version, with its
    standard error over tasks; pass@1 is the mean over tasks of each task's success rate."""
    by_name: dict[str, list[EvalRow]] = defaultdict(list)
    for row in evaluations:
        by_name[row.name].append(row)
    versions = {
        name: min((r.version for r in rows if r.version is not None), default=None)
        for name, rows in by_name.items()
    }
    categories, values, errors, notes = [], [], [], []
    for name in sorted(by_name, key=lambda n: (versions[n] is not None, versions[n] or 0)):
        rows, version = by_name[name], versions[name]
        means = [r.resolved / r.attempts for r in rows if r.attempts]
        pass1 = sum(means) / len(means)
        error = statistics.stdev(means) / len(means) ** 0.5 if len(means) > 1 else 0.0
        categories.append(f"{name} (v{version})" if version is not None else name)
        values.append(pass1)
        errors.append(error)
        notes.append(f"{name}: {pass1:.3f} ± {error:.3f} over {len(means)} tasks")
    return Figure(
        key="heldout_pass1",
        title="Held-out pass@1 of the evaluated models (± standard error over tasks)",
        kind="bars",
        xlabel="model (weight version)",
        ylabel="pass@1",
        series=[Series("pass@1", list(range(len(values))), values, errors=errors)],
        points=len(values),
        empty_reason="no evaluation runs named <run>-eval-* in the store",
        categories=categories,
        notes=["; ".join(notes)] if notes else [],
    )


def turns_histogram(turns: list[tuple[int, int]], settings: ReportSettings) -> Figure:
    total = sum(n for _, n in turns)
    centres, counts, width = histogram(
        [float(t) for t, _ in turns], [float(n) for _, n in turns], settings.max_turn_bins, integer=True
    )
    values = [t for t, n in turns for _ in range(n)]
    notes = [f"median {statistics.median(values):g} turns, max {max(values)}"] if values else []
    return Figure(
        key="turns",
        title="Turns per trajectory",
        kind="hist",
        xlabel="turns",
        ylabel="trajectories",
        series=[Series("trajectories", centres, counts)],
        points=total,
        empty_reason="no finished trajectories",
        notes=notes,
        bin_width=width,
    )


def outcome_shares(outcomes: list[tuple[str, int]]) -> Figure:
    total = sum(n for _, n in outcomes)
    ordered = sorted(outcomes, key=lambda item: (_family_rank(item[0]), item[0]))
    return Figure(
        key="outcomes",
        title="Outcome shares",
        kind="bars",
        xlabel="outcome",
        ylabel="share of finished trajectories",
        categories=[o for o, _ in ordered],
        series=[Series("share", list(map(float, range(len(ordered)))), [n / total for _, n in ordered])],
        points=total,
        empty_reason="no finished trajectories",
        notes=[f"{total} finished trajectories"] if total else [],
    )


def trajectory_time(times: list[TimeRow]) -> Figure:
    by_family: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    counted = 0
    for row in times:
        if row.total_s <= 0:
            continue
        counted += row.trajectories
        parts = by_family[family(row.outcome)]
        for name in TRAJECTORY_PARTS:
            parts[name] += row.parts[name]
        parts["other"] += max(row.total_s - sum(row.parts.values()), 0.0)
    families = sorted(by_family, key=_family_rank)
    labels = {**PART_LABELS, "other": "other (agent, waits)"}
    series = [
        Series(label, list(map(float, range(len(families)))), [by_family[f][name] for f in families])
        for name, label in labels.items()
    ]
    total = sum(sum(parts.values()) for parts in by_family.values())
    shares = (
        {label: sum(s.y) / total for label, s in zip(labels.values(), series, strict=True)} if total else {}
    )
    return Figure(
        key="trajectory_time",
        title="Where rollout time goes (summed over trajectories, by outcome)",
        kind="stacked",
        xlabel="outcome",
        ylabel="seconds",
        categories=families,
        series=series,
        points=counted,
        empty_reason="no trajectory with a recorded time breakdown",
        notes=[", ".join(f"{label} {share:.0%}" for label, share in shares.items() if share > 0)]
        if shares
        else [],
    )


def step_time(steps: list[StepRow], spans_ns: list[tuple[int, int]], settings: ReportSettings) -> Figure:
    """The steps' time split, the wait split by what it was for, and a sentence naming what binds
    (`trainer.waits.wait_reason`, with the rollouts in flight during the waits)."""
    shown = steps[-settings.max_step_bars :]
    parts = [_step_parts(s.times) for s in shown]
    x = list(map(float, range(len(shown))))
    series = [Series(label, x, [p[name] for p in parts]) for name, label in STEP_PARTS.items()]
    grand = sum(sum(p.values()) for p in parts)
    waits = summarise_waits(
        [s.times for s in shown], mean_in_flight(spans_ns, [_wait_window(s) for s in shown])
    )
    notes = []
    if grand > 0:
        shares = {
            "wait": waits.wait_s,
            **{STEP_PARTS[k]: sum(p[k] for p in parts) for k in STEP_PARTS if not k.startswith("wait")},
        }
        notes = [", ".join(f"{k} {v / grand:.0%}" for k, v in shares.items()), wait_reason(waits)]
    return Figure(
        key="step_time",
        title="Trainer step time breakdown",
        kind="stacked",
        xlabel="trainer step",
        ylabel="seconds",
        categories=[str(s.step) for s in shown],
        series=series,
        points=sum(1 for p in parts if sum(p.values()) > 0),
        empty_reason="no trainer steps in this run (an eval-only run has none)",
        notes=notes,
    )


def _step_parts(times: dict[str, float]) -> dict[str, float]:
    split = {k: times.get(k, 0.0) for k in STEP_PARTS}
    split["wait_other_s"] = max(
        times.get("wait_s", 0.0) - split["wait_groups_s"] - split["wait_trajectories_s"], 0.0
    )
    return split


def _wait_window(step: StepRow) -> tuple[int, int]:
    """When the trainer waited before `step` (ns): from the step's start, for its wait_s."""
    start = step.time_ns - int(step.times.get("total_s", 0.0) * NS)
    return start, start + int(step.times.get("wait_s", 0.0) * NS)


def long_tail(spans_ns: list[tuple[int, int]], settings: ReportSettings) -> Figure:
    fraction = settings.finished_fraction
    marks: list[tuple[str, float]] = []
    notes: list[str] = []
    x: list[float] = []
    y: list[float] = []
    if spans_ns:
        origin = min(start for start, _ in spans_ns)
        spans = [((start - origin) / NS, (end - origin) / NS) for start, end in spans_ns]
        ends = sorted(end for _, end in spans)
        x = [0.0, *ends]
        y = [0.0, *(i / len(ends) for i in range(1, len(ends) + 1))]
        mark = finished_mark(ends, fraction)
        share = tail_share(spans, fraction)
        marks = [(f"{fraction:.0%} finished ({mark:.1f} s)", mark)]
        notes = [
            f"{share:.1%} of rollout wall time ({ends[-1]:.1f} s) passes after {fraction:.0%} had finished"
        ]
    return Figure(
        key="long_tail",
        title="The long tail: trajectories finished over rollout time",
        kind="curve",
        xlabel="seconds since the first trajectory started",
        ylabel="share finished",
        series=[Series("finished", x, y)],
        points=len(spans_ns),
        empty_reason="no finished trajectories",
        marks=marks,
        notes=notes,
    )


def infra_errors(outcomes: list[tuple[str, int]]) -> Figure:
    kinds = sorted((o.split(":", 1)[-1], n) for o, n in outcomes if family(o) == INFRA_PREFIX)
    total = sum(n for _, n in outcomes)
    errors = sum(n for _, n in kinds)
    return Figure(
        key="infra_errors",
        title="Infrastructure errors by kind (never scored)",
        kind="bars",
        xlabel="kind",
        ylabel="trajectories",
        categories=[k for k, _ in kinds],
        series=[Series("trajectories", list(map(float, range(len(kinds)))), [float(n) for _, n in kinds])],
        points=errors,
        empty_reason="no infrastructure errors",
        notes=[f"{errors} of {total} trajectories ({errors / total:.1%})"] if total else [],
    )


def stability(steps: list[StepRow]) -> Figure:
    x = [float(s.step) for s in steps]
    notes = []
    if steps:
        diff = statistics.median(s.mean_logprob_diff for s in steps)
        ess = statistics.median(s.ess for s in steps)
        notes = [f"median |Δ logprob| {diff:.4f}, median ESS {ess:.1%} (reference run: 0.011, 93%)"]
    return Figure(
        key="stability",
        title="Trainer vs engine: logprob difference and ESS by step",
        kind="lines",
        xlabel="trainer step",
        ylabel="mean |logprob(trainer) − logprob(engine)|",
        ylabel_right="effective sample size",
        series=[
            Series("mean |Δ logprob|", x, [s.mean_logprob_diff for s in steps]),
            Series("ESS (tokens)", x, [s.ess for s in steps], axis=1),
            Series("ESS (sequences)", x, [s.ess_seq for s in steps], axis=1),
        ],
        points=len(steps),
        empty_reason="no trainer steps in this run (an eval-only run has none)",
        notes=notes,
    )


def cap_waits(waits: list[float], settings: ReportSettings) -> Figure:
    centres, counts, width = histogram(waits, [1.0] * len(waits), settings.wait_bins, integer=False)
    notes = []
    if waits:
        p90 = float(np.quantile(waits, 0.9, method="inverted_cdf"))
        notes = [f"median {statistics.median(waits):.3f} s, p90 {p90:.3f} s, max {max(waits):.3f} s"]
    return Figure(
        key="cap_waits",
        title="Sandbox cap wait (queued before a sandbox started)",
        kind="hist",
        xlabel="seconds waited",
        ylabel="sandboxes",
        series=[Series("sandboxes", centres, counts)],
        points=len(waits),
        empty_reason="no sandbox became ready",
        notes=notes,
        bin_width=width,
    )


def figures(rows: RunRows, settings: ReportSettings) -> list[Figure]:
    """Every figure of the report, in page order."""
    return [
        pass1_by_version(rows.versions),
        heldout_pass1(rows.evaluations),
        outcome_shares(rows.outcomes),
        turns_histogram(rows.turns, settings),
        long_tail(rows.spans_ns, settings),
        trajectory_time(rows.times),
        step_time(rows.steps, rows.spans_ns, settings),
        stability(rows.steps),
        infra_errors(rows.outcomes),
        cap_waits(rows.cap_waits_s, settings),
    ]


def _family_rank(outcome: str) -> int:
    name = family(outcome)
    return FAMILY_ORDER.index(name) if name in FAMILY_ORDER else len(FAMILY_ORDER)
