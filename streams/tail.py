"""The reference run's tail figures for any set of folded trajectories (pure).

- share of trajectories at the turn cap (`truncated:turns`, or turns at the limit in force);
- median turns of resolved trajectories;
- tail share: the share of rollout wall time (first start to last finish) that
  passes after 90% of trajectories have finished (32% in the reference run);
- the slowest trajectory;
- per group, the ratio of its longest to its shortest counted attempt in turns
  (median and max over groups).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streams.assemble import Trajectory
from streams.groups import counted_attempts
from streams.outcomes import Outcome

NS = 1e9


@dataclass(frozen=True)
class TailFigures:
    trajectories: int
    at_turn_cap_share: float
    median_turns_resolved: float | None
    tail_share: float
    wall_s: float
    slowest_trajectory: str | None
    slowest_s: float
    slowest_turns: int
    group_length_ratio_median: float | None
    group_length_ratio_max: float | None


def tail_share(spans: Sequence[tuple[float, float]], finished_fraction: float = 0.9) -> float:
    """Share of the wall time (first start .. last end) after `finished_fraction` of spans ended."""
    if not spans:
        return 0.0
    ends = sorted(end for _, end in spans)
    start = min(begin for begin, _ in spans)
    wall = ends[-1] - start
    if wall <= 0:
        return 0.0
    return (ends[-1] - finished_mark(ends, finished_fraction)) / wall


def finished_mark(ends: Sequence[float], finished_fraction: float = 0.9) -> float:
    """The end by which `finished_fraction` of spans had ended (nearest rank, the rule of
    bench.figures.percentile); `ends` must not be empty."""
    return float(np.quantile(list(ends), finished_fraction, method="inverted_cdf"))


def at_turn_cap(trajectory: Trajectory) -> bool:
    return trajectory.outcome == Outcome.TRUNCATED_TURNS or trajectory.turns >= trajectory.limits.max_turns


def group_length_ratios(trajectories: Sequence[Trajectory]) -> list[float]:
    """Per group: longest / shortest counted scored attempt, in turns (at least 1)."""
    by_group: dict[str, list[Trajectory]] = defaultdict(list)
    for trajectory in trajectories:
        by_group[trajectory.group_id].append(trajectory)
    ratios = []
    for members in by_group.values():
        turns = [max(t.turns, 1) for t in counted_attempts(members).values() if t.is_scored]
        if len(turns) >= 2:
            ratios.append(max(turns) / min(turns))
    return ratios


def tail_figures(trajectories: Sequence[Trajectory]) -> TailFigures:
    if not trajectories:
        return TailFigures(0, 0.0, None, 0.0, 0.0, None, 0.0, 0, None, None)
    resolved = [t.turns for t in trajectories if t.outcome == Outcome.RESOLVED]
    spans = [(t.started_ns / NS, t.finished_ns / NS) for t in trajectories]
    slowest = max(trajectories, key=lambda t: (t.duration_s, t.trajectory_id))
    ratios = group_length_ratios(trajectories)
    return TailFigures(
        trajectories=len(trajectories),
        at_turn_cap_share=sum(at_turn_cap(t) for t in trajectories) / len(trajectories),
        median_turns_resolved=statistics.median(resolved) if resolved else None,
        tail_share=tail_share(spans),
        wall_s=max(end for _, end in spans) - min(start for start, _ in spans),
        slowest_trajectory=slowest.trajectory_id,
        slowest_s=slowest.duration_s,
        slowest_turns=slowest.turns,
        group_length_ratio_median=statistics.median(ratios) if ratios else None,
        group_length_ratio_max=max(ratios) if ratios else None,
    )
