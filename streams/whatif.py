"""What-if: replay a run under other policies and say what would have changed (pure).

`what_if(run, recorded_policy, new_policy, cut)` replays the run twice, with the
recorded policy and with the new one (episodes cut to `cut` when a length limit
changed), and reports how many trajectory and group records change, the rollout
time that would have been saved (per trajectory, recorded duration minus the
duration up to where the new limits stop it, summed), resolved trajectories
that would have been lost, and the tail figures before and after.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from streams.events import Event
from streams.outcomes import Outcome
from streams.payloads import Limits
from streams.replay import RecordedRun, replay
from streams.settings import PolicySettings
from streams.tail import TailFigures, tail_figures


@dataclass(frozen=True)
class WhatIf:
    trajectories_total: int
    trajectories_changed: int
    groups_total: int
    groups_changed: int
    groups_kept_before: int
    groups_kept_after: int
    rollout_time_saved_s: float
    rollout_time_s: float
    resolved_lost: int
    before: TailFigures
    after: TailFigures


def changed(before: Sequence[Event], after: Sequence[Event]) -> int:
    """Records (by id) that appear on one side only or whose payload differs."""
    old = {e.id: e.data for e in before}
    new = {e.id: e.data for e in after}
    return len(old.keys() ^ new.keys()) + sum(1 for i in old.keys() & new.keys() if old[i] != new[i])


def what_if(run: RecordedRun, recorded: PolicySettings, new: PolicySettings, cut: Limits | None) -> WhatIf:
    base = replay(run, recorded)
    other = replay(run, new, cut)
    old_by_id = {t.trajectory_id: t for t in base.folded}
    new_by_id = {t.trajectory_id: t for t in other.folded}
    saved = sum(
        max(0.0, old_by_id[i].duration_s - new_by_id[i].duration_s)
        for i in old_by_id.keys() & new_by_id.keys()
    )
    lost = sum(
        1
        for i, t in old_by_id.items()
        if t.outcome == Outcome.RESOLVED and (i not in new_by_id or new_by_id[i].outcome != Outcome.RESOLVED)
    )
    return WhatIf(
        trajectories_total=len(base.trajectories),
        trajectories_changed=changed(base.trajectories, other.trajectories),
        groups_total=len(base.groups),
        groups_changed=changed(base.groups, other.groups),
        groups_kept_before=sum(1 for g in base.groups if g.data.dropped is None),  # type: ignore[attr-defined]
        groups_kept_after=sum(1 for g in other.groups if g.data.dropped is None),  # type: ignore[attr-defined]
        rollout_time_saved_s=saved,
        rollout_time_s=sum(t.duration_s for t in base.folded),
        resolved_lost=lost,
        before=tail_figures(base.folded),
        after=tail_figures(other.folded),
    )
