"""Every SQL the run report runs: SQLAlchemy Core over the store's projections, one run at a time.

Each function takes a connection (SQLite or PostgreSQL; `streams.store.open_readonly`
gives one that cannot write) and a run id, and returns plain rows: aggregates where
the database can do them (counts, sums, means by version, outcome, turns), raw values
where the figure needs them all (finish times, cap waits). No plotting here and no
figure logic: `figures` turns these rows into figure data.

A trajectory's weight version is the version of its first generated token
(`trajectories.start_policy_version`; None for one that never generated); pass@1
is the reference run's: the mean of per-attempt success over scored attempts
(infrastructure errors are never scored, so they count neither way).

`PASS1_BY_VERSION_SQL` and `ROLLOUT_TIME_SQL` are the ready-made statements the
README quotes for `rollstream sql` (every run, one row per run and version / per run,
times as shares of trajectory wall time); the tests run these exact strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, case, func, select, text

from streams.store.models import EventRow, SandboxLifecycle, TrainerStepRow, Trajectory

E = EventRow.__table__
T = Trajectory.__table__
S = SandboxLifecycle.__table__
STEPS = TrainerStepRow.__table__
INFRA_PREFIX = "infra_error"
TRAJECTORY_PARTS = ("llm_s", "tool_s", "sandbox_start_s", "agent_install_s", "tests_s", "queue_s")

PASS1_BY_VERSION_SQL = """\
SELECT run_id, start_policy_version AS version,
       COUNT(*) AS attempts,
       AVG(CASE WHEN outcome = 'resolved' THEN 1.0 ELSE 0.0 END) AS pass1,
       AVG(reward) AS reward_mean
FROM trajectories
WHERE finished_ns IS NOT NULL AND outcome NOT LIKE 'infra_error%'
GROUP BY run_id, start_policy_version
ORDER BY run_id, version"""

ROLLOUT_TIME_SQL = """\
SELECT run_id, COUNT(*) AS trajectories, SUM(total_s) AS total_s,
       SUM(llm_s) / SUM(total_s) AS llm, SUM(tool_s) / SUM(total_s) AS tools,
       SUM(sandbox_start_s) / SUM(total_s) AS sandbox_start,
       SUM(agent_install_s) / SUM(total_s) AS agent_install,
       SUM(tests_s) / SUM(total_s) AS tests, SUM(queue_s) / SUM(total_s) AS queue
FROM trajectories
WHERE finished_ns IS NOT NULL AND total_s > 0
GROUP BY run_id
ORDER BY run_id"""


@dataclass(frozen=True)
class VersionRow:
    """Trajectories whose first token came from one weight version (None: they generated none)."""

    version: int | None
    scored: int  # attempts that count for pass@1 (not infrastructure errors)
    resolved: int
    infra_errors: int
    reward_mean: float | None


@dataclass(frozen=True)
class OutcomeRow:
    """The finished trajectories with one outcome: the verifier's reward and the one the trainer used.

    They differ where a policy changed it: `policy.overlong="zero"` trains a truncated episode
    as a failure (reward 0) whatever its tests scored, `"drop"` leaves it out; a member of a
    dropped group (zero variance, stale, too few valid) is not trained on at all."""

    outcome: str
    trajectories: int
    mean_turns: float | None
    verifier_reward: float | None  # mean of `trajectories.reward` (None: infrastructure errors)
    trained: int  # members of kept groups
    trained_reward: float | None  # mean of their rewards in `group.formed` (None: none trained)
    mean_s: float | None


@dataclass(frozen=True)
class TimeRow:
    """Summed seconds of the finished trajectories with one outcome."""

    outcome: str
    trajectories: int
    parts: dict[str, float]  # TRAJECTORY_PARTS -> seconds
    total_s: float


@dataclass(frozen=True)
class StepRow:
    """One trainer step: stability figures and its time split (`times`: wait_s, logprob_s, ...)."""

    step: int
    version: int
    mean_logprob_diff: float
    ess: float
    ess_seq: float
    times: dict[str, float]
    time_ns: int = 0  # when the step was written (after it published)


@dataclass(frozen=True)
class EvalRow:
    """One task of one of the run's evaluations (`<run>-eval-<name>`): its attempts and successes."""

    name: str  # the evaluation's name: base, sft, rl, before, after, ...
    version: int | None  # weight version of the evaluated model (its tokens')
    task_id: str
    attempts: int
    resolved: int


@dataclass(frozen=True)
class RunRows:
    """Everything the report shows about one run, as the store answered it."""

    run_id: str
    versions: list[VersionRow]
    turns: list[tuple[int, int]]  # (turns, trajectories)
    outcomes: list[tuple[str, int]]  # (outcome, trajectories)
    rewards: list[OutcomeRow]
    times: list[TimeRow]
    spans_ns: list[tuple[int, int]]  # (started_ns, finished_ns) per finished trajectory
    steps: list[StepRow]
    cap_waits_s: list[float]  # sandbox queue wait per sandbox that became ready
    evaluations: list[EvalRow] = field(default_factory=list)  # held-out evaluations of the run's models


def _finished(run_id: str) -> Any:
    return (T.c.run_id == run_id) & T.c.finished_ns.is_not(None)


def version_rows(conn: Connection, run_id: str) -> list[VersionRow]:
    version = T.c.start_policy_version
    infra = T.c.outcome.like(f"{INFRA_PREFIX}%")
    stmt = (
        select(
            version.label("version"),
            func.sum(case((infra, 0), else_=1)),
            func.sum(case((T.c.outcome == "resolved", 1), else_=0)),
            func.sum(case((infra, 1), else_=0)),
            func.avg(T.c.reward),
        )
        .where(_finished(run_id))
        .group_by(version)
        .order_by(version)
    )
    return [
        VersionRow(
            None if v is None else int(v),
            int(scored),
            int(resolved),
            int(infra_n),
            None if mean is None else float(mean),
        )
        for v, scored, resolved, infra_n, mean in conn.execute(stmt)
    ]


def turn_counts(conn: Connection, run_id: str) -> list[tuple[int, int]]:
    stmt = (
        select(T.c.turns, func.count())
        .where(_finished(run_id) & T.c.turns.is_not(None))
        .group_by(T.c.turns)
        .order_by(T.c.turns)
    )
    return [(int(turns), int(n)) for turns, n in conn.execute(stmt)]


def outcome_counts(conn: Connection, run_id: str) -> list[tuple[str, int]]:
    stmt = (
        select(T.c.outcome, func.count()).where(_finished(run_id)).group_by(T.c.outcome).order_by(T.c.outcome)
    )
    return [(str(outcome), int(n)) for outcome, n in conn.execute(stmt)]


def trained_rewards(conn: Connection, run_id: str) -> dict[str, float]:
    """Trajectory id -> the reward the trainer used: its entry in a kept `group.formed` (the
    group's copies from several stream workers are the same group)."""
    stmt = select(E.c.data).where((E.c.run_id == run_id) & (E.c.type == "group.formed"))
    out: dict[str, float] = {}
    for (data,) in conn.execute(stmt):
        group = json.loads(data) if isinstance(data, str) else data
        if group.get("dropped") is None:
            out.update(zip(group["members"], map(float, group["rewards"]), strict=True))
    return out


def outcome_rewards(conn: Connection, run_id: str) -> list[OutcomeRow]:
    """Per outcome: count, mean turns, the verifier's mean reward and the trainer's, mean seconds."""
    trained = trained_rewards(conn, run_id)
    stmt = (
        select(T.c.trajectory_id, T.c.outcome, T.c.turns, T.c.reward, T.c.total_s)
        .where(_finished(run_id))
        .order_by(T.c.outcome, T.c.trajectory_id)
    )
    by_outcome: dict[str, list[Any]] = {}
    for row in conn.execute(stmt):
        by_outcome.setdefault(str(row.outcome), []).append(row)
    return [_outcome_row(outcome, rows, trained) for outcome, rows in by_outcome.items()]


def _outcome_row(outcome: str, rows: list[Any], trained: dict[str, float]) -> OutcomeRow:
    used = [trained[r.trajectory_id] for r in rows if r.trajectory_id in trained]
    return OutcomeRow(
        outcome=outcome,
        trajectories=len(rows),
        mean_turns=_mean([r.turns for r in rows]),
        verifier_reward=_mean([r.reward for r in rows]),
        trained=len(used),
        trained_reward=_mean(used),
        mean_s=_mean([r.total_s for r in rows]),
    )


def _mean(values: list[Any]) -> float | None:
    known = [float(v) for v in values if v is not None]
    return sum(known) / len(known) if known else None


def time_rows(conn: Connection, run_id: str) -> list[TimeRow]:
    sums = [func.coalesce(func.sum(T.c[name]), 0.0) for name in TRAJECTORY_PARTS]
    stmt = (
        select(T.c.outcome, func.count(), *sums, func.coalesce(func.sum(T.c.total_s), 0.0))
        .where(_finished(run_id))
        .group_by(T.c.outcome)
        .order_by(T.c.outcome)
    )
    out = []
    for outcome, n, *values in conn.execute(stmt):
        parts = {name: float(v) for name, v in zip(TRAJECTORY_PARTS, values[:-1], strict=True)}
        out.append(TimeRow(str(outcome), int(n), parts, float(values[-1])))
    return out


def spans(conn: Connection, run_id: str) -> list[tuple[int, int]]:
    stmt = (
        select(T.c.started_ns, T.c.finished_ns)
        .where(_finished(run_id) & T.c.started_ns.is_not(None))
        .order_by(T.c.finished_ns, T.c.trajectory_id)
    )
    return [(int(start), int(end)) for start, end in conn.execute(stmt)]


def step_rows(conn: Connection, run_id: str) -> list[StepRow]:
    stmt = (
        select(
            STEPS.c.step,
            STEPS.c.version,
            STEPS.c.mean_logprob_diff,
            STEPS.c.ess,
            STEPS.c.ess_seq,
            STEPS.c.times,
            STEPS.c.time_ns,
        )
        .where(STEPS.c.run_id == run_id)
        .order_by(STEPS.c.step)
    )
    return [
        StepRow(int(step), int(version), float(diff), float(ess), float(ess_seq), _float_map(times), int(at))
        for step, version, diff, ess, ess_seq, times, at in conn.execute(stmt)
    ]


def cap_waits(conn: Connection, run_id: str) -> list[float]:
    stmt = (
        select(S.c.queue_wait_s)
        .where((S.c.run_id == run_id) & S.c.queue_wait_s.is_not(None) & S.c.ready_ns.is_not(None))
        .order_by(S.c.queue_wait_s)
    )
    return [float(wait) for (wait,) in conn.execute(stmt)]


def evaluation_rows(conn: Connection, run_id: str) -> list[EvalRow]:
    """Per task, the scored attempts of each evaluation run named `<run_id>-eval-<name>` (the demo's
    before/after, bench learning's base/sft/rl); infrastructure errors are never scored."""
    prefix = f"{run_id}-eval-"
    scored = T.c.finished_ns.is_not(None) & T.c.outcome.not_like(f"{INFRA_PREFIX}%")
    stmt = (
        select(
            T.c.run_id,
            func.min(T.c.start_policy_version),
            T.c.task_id,
            func.count(),
            func.sum(case((T.c.outcome == "resolved", 1), else_=0)),
        )
        .where(T.c.run_id.startswith(prefix, autoescape=True) & scored)
        .group_by(T.c.run_id, T.c.task_id)
        .order_by(func.min(T.c.started_ns))
    )
    return [
        EvalRow(str(run)[len(prefix) :], None if v is None else int(v), str(task), int(n), int(ok))
        for run, v, task, n, ok in conn.execute(stmt)
    ]


def run_rows(conn: Connection, run_id: str) -> RunRows:
    """Every query of the report, on one connection."""
    return RunRows(
        run_id=run_id,
        versions=version_rows(conn, run_id),
        turns=turn_counts(conn, run_id),
        outcomes=outcome_counts(conn, run_id),
        rewards=outcome_rewards(conn, run_id),
        times=time_rows(conn, run_id),
        spans_ns=spans(conn, run_id),
        steps=step_rows(conn, run_id),
        cap_waits_s=cap_waits(conn, run_id),
        evaluations=evaluation_rows(conn, run_id),
    )


def run_ids(conn: Connection) -> list[str]:
    """Runs with at least one trajectory, newest first (for the "no such run" message)."""
    stmt = select(T.c.run_id).group_by(T.c.run_id).order_by(func.max(T.c.started_ns).desc())
    return [str(run) for (run,) in conn.execute(stmt)]


def ready_made(conn: Connection, sql: str) -> list[dict[str, Any]]:
    """One of the README's statements, as dicts (what `rollstream sql --format json` prints)."""
    result = conn.execute(text(sql))
    return [dict(row._mapping) for row in result]


def _float_map(value: Any) -> dict[str, float]:
    """A JSON object column (dict on both backends; text if a driver hands it over undecoded)."""
    if isinstance(value, str):
        value = json.loads(value)
    return {str(k): float(v) for k, v in (value or {}).items() if v is not None}  # None: not recorded
