"""What `bench chaos` counts at the end of a run (pure: no Kafka, no SQL, no clock).

The same functions run twice, on records read from the topics and on rows read from the
sink's SQL store (`bench.chaos_sources`), so the two counts are independent:

- `count_trajectories(requested, finishes)`: requested = distinct trajectory ids on
  `rollout.requests` (infra re-runs included: each is a new trajectory id); finished =
  requested ids with a `trajectory.finished`; lost = requested without one; duplicated =
  trajectory ids with two *different* finished events (two finished records of one
  trajectory that an id-deduplicating consumer would both count). `copies` counts records
  (or rows) beyond the first of one event id: a killed rollout worker's re-run writes the
  same ids again, by design, and every consumer keeps one of them.
- `count_infra(finishes, assembled, groups)`: infra errors recorded, those marked
  injected, injected ones not recorded as `infra_error:*`, and infra errors that reached a
  reward (on `trajectory.finished` or `trajectories`) or a group's members (an advantage).
- `count_training(groups, steps)`: the kept groups in offset order against the group ids
  of the trainer's steps (one record per step: a restarted trainer re-runs steps after
  its checkpoint under the same event ids): trained twice, skipped (kept, before the last
  trained one, never trained), out of order, trained but not kept, steps that disagree.
- `count_versions(published, loaded, generated)`: weight versions published, loaded by
  the engine (its log, `parse_engine_loads`), and used by generated tokens.
- `kill_schedule(seed, kills, start, end)`: when each process is killed, as a fraction
  of the run's progress: evenly spaced slots, the order shuffled by the seed.
"""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Finish:
    trajectory_id: str
    event_id: str
    outcome: str
    reward: float | None
    injected: bool


@dataclass(frozen=True)
class Assembled:
    trajectory_id: str
    event_id: str
    outcome: str
    reward: float | None


@dataclass(frozen=True)
class GroupRecord:
    group_id: str
    event_id: str
    members: tuple[str, ...]
    dropped: str | None


@dataclass(frozen=True)
class StepRecord:
    step: int
    event_id: str
    group_ids: tuple[str, ...]


@dataclass(frozen=True)
class TrajectoryCounts:
    requested: int
    finished: int
    lost: int
    duplicated: int
    copies: int
    lost_ids: tuple[str, ...]


@dataclass(frozen=True)
class InfraCounts:
    recorded: int
    injected: int
    injected_unrecorded: int
    scored: int


@dataclass(frozen=True)
class TrainingCounts:
    kept: int
    trained: int
    trained_twice: int
    skipped: int
    out_of_order: int
    trained_not_kept: int
    step_conflicts: int
    untrained_tail: int  # kept after the last trained group (formed after the trainer stopped)
    groups_duplicated: int  # group ids with two different `groups` events


@dataclass(frozen=True)
class VersionCounts:
    published: int
    loaded: int
    generated: int
    last_published: int
    last_loaded: int
    loaded_unpublished: int


def _copies(event_ids: Iterable[str]) -> int:
    counts = Counter(event_ids)
    return sum(n - 1 for n in counts.values())


def _distinct(finishes: Iterable[Finish]) -> dict[str, dict[str, Finish]]:
    """trajectory id -> event id -> its (first) finish."""
    by_tid: dict[str, dict[str, Finish]] = defaultdict(dict)
    for finish in finishes:
        by_tid[finish.trajectory_id].setdefault(finish.event_id, finish)
    return by_tid


def count_trajectories(requested: Iterable[str], finishes: Sequence[Finish]) -> TrajectoryCounts:
    wanted = set(requested)
    by_tid = _distinct(finishes)
    lost = sorted(wanted - set(by_tid))
    return TrajectoryCounts(
        requested=len(wanted),
        finished=len(wanted & set(by_tid)),
        lost=len(lost),
        duplicated=sum(1 for ids in by_tid.values() if len(ids) > 1),
        copies=_copies(f.event_id for f in finishes),
        lost_ids=tuple(lost),
    )


def count_infra(
    finishes: Iterable[Finish], assembled: Iterable[Assembled], groups: Iterable[GroupRecord]
) -> InfraCounts:
    """Per trajectory id. Scored: an infra-error finish or assembled record with a reward, or a
    group member whose assembled record is an infra error (or, without one, whose every
    finish is). A trajectory finished twice, once scored and once as an infra error, is a
    duplicate (`count_trajectories`), not a scored infra error, unless its group used the
    infra copy."""
    finishes, assembled = list(finishes), list(assembled)
    infra = {f.trajectory_id for f in finishes if _is_infra(f.outcome)}
    injected = {f.trajectory_id for f in finishes if f.injected}
    only_infra = infra - {f.trajectory_id for f in finishes if not _is_infra(f.outcome)}
    used = {a.trajectory_id: a for a in assembled}
    scored = {f.trajectory_id for f in finishes if _is_infra(f.outcome) and f.reward is not None}
    scored |= {a.trajectory_id for a in assembled if _is_infra(a.outcome) and a.reward is not None}
    for member in (m for g in groups for m in g.members):
        record = used.get(member)
        if (record is not None and _is_infra(record.outcome)) or (record is None and member in only_infra):
            scored.add(member)
    return InfraCounts(
        recorded=len(infra),
        injected=len(injected),
        injected_unrecorded=len(injected - infra),
        scored=len(scored),
    )


def _is_infra(outcome: str) -> bool:
    return outcome.startswith("infra_error")


def _first_per_group(groups: Sequence[GroupRecord]) -> tuple[list[GroupRecord], int]:
    """Groups in offset order, one per group id (the first event), and how many group ids had two events."""
    seen: dict[str, str] = {}
    ordered, twice = [], set()
    for group in groups:
        if group.group_id not in seen:
            seen[group.group_id] = group.event_id
            ordered.append(group)
        elif seen[group.group_id] != group.event_id:
            twice.add(group.group_id)
    return ordered, len(twice)


def _trained_sequence(steps: Iterable[StepRecord]) -> tuple[list[str], int]:
    """The group ids trained on, in step order (one record per step), and steps recorded twice differently."""
    per_step: dict[int, tuple[str, ...]] = {}
    conflicts = set()
    for step in steps:
        if step.step in per_step and per_step[step.step] != step.group_ids:
            conflicts.add(step.step)
        per_step.setdefault(step.step, step.group_ids)
    return [gid for s in sorted(per_step) for gid in per_step[s]], len(conflicts)


def count_training(groups: Sequence[GroupRecord], steps: Iterable[StepRecord]) -> TrainingCounts:
    ordered, groups_twice = _first_per_group(groups)
    kept = [g.group_id for g in ordered if g.dropped is None]
    trained, conflicts = _trained_sequence(steps)
    trained_set = set(trained)
    kept_set = set(kept)
    positions = [i for i, gid in enumerate(kept) if gid in trained_set]
    last = positions[-1] if positions else -1
    in_kept_order = [gid for gid in kept if gid in trained_set]
    deduped = list(dict.fromkeys(gid for gid in trained if gid in kept_set))
    return TrainingCounts(
        kept=len(kept),
        trained=len(trained_set),
        trained_twice=len(trained) - len(trained_set),
        skipped=sum(1 for gid in kept[: last + 1] if gid not in trained_set),
        out_of_order=sum(1 for a, b in zip(deduped, in_kept_order, strict=True) if a != b),
        trained_not_kept=len(trained_set - kept_set),
        step_conflicts=conflicts,
        untrained_tail=len(kept) - (last + 1),
        groups_duplicated=groups_twice,
    )


def count_versions(
    published: Iterable[int], loaded: Iterable[int], generated: Iterable[int]
) -> VersionCounts:
    pub, load, gen = set(published), set(loaded), set(generated)
    return VersionCounts(
        published=len(pub),
        loaded=len(load),
        generated=len(gen),
        last_published=max(pub, default=-1),
        last_loaded=max(load, default=-1),
        loaded_unpublished=len(load - pub),
    )


_LOAD = re.compile(r"weight version (\d+) -> (\d+) of run (\S+)")


def parse_engine_loads(log_text: str, run_id: str) -> list[int]:
    """The versions an engine's log says it loaded for `run_id` (agents.engine.follow's line)."""
    return [int(m.group(2)) for m in _LOAD.finditer(log_text) if m.group(3) == run_id]


@dataclass(frozen=True)
class Kill:
    at: float  # fraction of the run's progress
    target: str


def kill_schedule(seed: int, kills: Sequence[str], start: float, end: float) -> list[Kill]:
    """One kill per entry of `kills` (a target named twice is killed twice), on evenly spaced
    slots in [start, end], assigned in an order shuffled by `seed` with no target twice in a row."""
    if not 0 <= start < end <= 1:
        raise ValueError(f"need 0 <= start < end <= 1, got {start}, {end}")
    if not kills:
        return []
    times = [start + (end - start) * i / max(1, len(kills) - 1) for i in range(len(kills))]
    order = list(kills)
    rng = random.Random(seed)
    for _ in range(1000):  # a target's restart should be over before its next kill
        rng.shuffle(order)
        if all(a != b for a, b in itertools.pairwise(order)):
            break
    return [Kill(round(at, 4), target) for at, target in zip(times, order, strict=True)]
