"""Runs for the report tests, built on `streams.eventgen`: a training run with every figure's data
(weight versions whose pass rate rises, infrastructure errors of three kinds, trainer steps
with their time split, varied sandbox cap waits, per-trajectory time breakdowns) and an
eval-only run (one version, no trainer steps, no infrastructure errors). Pure and seeded.
`expected_pass1` computes pass@1 by version from the events alone, for comparing with SQL.
"""

from __future__ import annotations

import random
from collections import Counter

from streams.eventgen import NS, AttemptSpec, group_events, weights_event
from streams.events import Event, make_event
from streams.outcomes import Outcome
from streams.payloads import (
    Limits,
    SandboxReady,
    StepTimes,
    TestsRan,
    TimeBreakdown,
    ToolExecuted,
    TrainerStep,
    TrajectoryFinished,
    TurnGenerated,
)

TRAIN, EVAL = "train-run", "eval-run"  # the run ids the report tests use
T0_NS = 1_795_000_000 * NS
GROUP_SIZE = 4
MAX_TURNS = 8
INFRA = (Outcome.INFRA_SANDBOX_START, Outcome.INFRA_SANDBOX_LOST, Outcome.INFRA_VERIFIER)


def training_run(run_id: str, groups: int = 12, groups_per_step: int = 3, seed: int = 1) -> list[Event]:
    """GROUP_SIZE attempts per group; every `groups_per_step` groups a trainer step and a new version."""
    rng = random.Random(seed)
    events: list[Event] = []
    version = 0
    for index in range(groups):
        specs = _attempts(rng, version, infra=INFRA[index % len(INFRA)] if index % 2 == 0 else None)
        events += _group(rng, run_id, index, specs)
        if index % groups_per_step == groups_per_step - 1:
            version += 1
            last_ns = max(e.time_ns for e in events)
            events += [
                _step(rng, run_id, version, last_ns + NS),
                weights_event(run_id, version, last_ns + 2 * NS),
            ]
    return events


def eval_run(run_id: str, version: int = 5, groups: int = 4, seed: int = 2) -> list[Event]:
    """Scored attempts under one weight version; no trainer steps, no infrastructure errors."""
    rng = random.Random(seed)
    events: list[Event] = []
    for index in range(groups):
        events += _group(rng, run_id, index, _attempts(rng, version, infra=None))
    return events


def _attempts(rng: random.Random, version: int, infra: Outcome | None) -> list[AttemptSpec]:
    specs = []
    for attempt in range(GROUP_SIZE):
        start = rng.random() * 2
        retry = 0
        if infra is not None and attempt == 0:
            specs.append(
                AttemptSpec(attempt, 0, 0, infra, None, version, start_s=start, group_size=GROUP_SIZE)
            )
            retry, start = 1, start + 1.0
        roll = rng.random()
        if roll < 0.15:  # a straggler at the turn cap
            outcome, turns, reward = Outcome.TRUNCATED_TURNS, MAX_TURNS, 0.0
        elif roll < 0.15 + 0.2 + 0.15 * version:  # the pass rate rises with the version
            outcome, turns, reward = Outcome.RESOLVED, rng.randint(2, 5), 1.0
        else:
            outcome, turns, reward = Outcome.UNRESOLVED, rng.randint(2, MAX_TURNS - 1), 0.0
        turn_s = 0.5 + rng.random() * (3.0 if outcome == Outcome.TRUNCATED_TURNS else 1.0)
        spec = AttemptSpec(attempt, retry, turns, outcome, reward, version, start_s=start, turn_s=turn_s)
        specs.append(spec)
    return specs


def _group(rng: random.Random, run_id: str, index: int, specs: list[AttemptSpec]) -> list[Event]:
    episodes = group_events(
        run_id,
        f"{run_id}/g{index:04d}",
        specs,
        t0_ns=T0_NS + index * 20 * NS,
        limits=Limits(max_turns=MAX_TURNS),
    )
    waits = {e.trajectory_id: round(rng.expovariate(4.0), 3) for e in episodes if e.type == "sandbox.ready"}
    episodes = sorted(
        (_with_wait(e, waits) for e in episodes), key=lambda e: (e.time_ns, e.trajectory_id or "", e.seq)
    )
    return [_with_times(e, episodes) for e in episodes]


def _with_wait(event: Event, waits: dict[str | None, float]) -> Event:
    """The event after the sandbox queued `waits[trajectory]` seconds: ready and later events come later."""
    wait = waits.get(event.trajectory_id)
    if wait is None or event.type in ("trajectory.started", "sandbox.requested"):
        return event
    update: dict[str, object] = {"time_ns": event.time_ns + int(wait * NS)}
    if isinstance(event.data, SandboxReady):
        update["data"] = event.data.model_copy(update={"queue_wait_s": wait})
    return event.model_copy(update=update)


def _with_times(event: Event, episodes: list[Event]) -> Event:
    """A finished event with the time breakdown its episode's events add up to (as the worker reports)."""
    if not isinstance(event.data, TrajectoryFinished):
        return event
    own = [e for e in episodes if e.trajectory_id == event.trajectory_id]
    ready = [e.data for e in own if isinstance(e.data, SandboxReady)]
    times = TimeBreakdown(
        llm_s=sum(e.data.latency_s for e in own if isinstance(e.data, TurnGenerated)),
        tool_s=sum(e.data.duration_s for e in own if isinstance(e.data, ToolExecuted)),
        sandbox_start_s=sum(r.start_s for r in ready),
        tests_s=sum(e.data.duration_s for e in own if isinstance(e.data, TestsRan)),
        queue_s=sum(r.queue_wait_s for r in ready),
        total_s=(event.time_ns - min(e.time_ns for e in own)) / NS,
    )
    return event.model_copy(update={"data": event.data.model_copy(update={"times": times})})


def _step(rng: random.Random, run_id: str, version: int, time_ns: int) -> Event:
    wait, logprob, update, publish = (rng.uniform(0.5, 4.0), rng.uniform(0.2, 0.6), rng.uniform(1, 3), 0.3)
    data = TrainerStep(
        step=version,
        version=version,
        groups=3,
        trajectories=3 * GROUP_SIZE,
        loss=rng.uniform(-0.1, 0.1),
        grad_norm=rng.uniform(0.01, 0.3),
        mean_logprob_diff=rng.uniform(0.005, 0.02),
        ess=rng.uniform(0.85, 0.99),
        ess_seq=rng.uniform(0.8, 0.95),
        reward_mean=rng.random(),
        times=StepTimes(
            wait_s=wait,
            wait_groups_s=0.8 * wait,
            wait_trajectories_s=0.1 * wait,
            wait_cpu_busy=0.95,
            logprob_s=logprob,
            update_s=update,
            publish_s=publish,
            total_s=wait + logprob + update + publish,
        ),
    )
    return make_event(
        data,
        run_id=run_id,
        seq=version,
        time_ns=time_ns,
        source="trainer",
        policy_version=version,
        id_key=f"trainer:{run_id}",
    )


def expected_pass1(events: list[Event]) -> dict[int, float]:
    """pass@1 by the version of each trajectory's first generated token, from the events alone."""
    version = {
        e.trajectory_id: e.data.output_versions[0]  # type: ignore[attr-defined]
        for e in events
        if e.type == "turn.generated" and e.data.turn == 1  # type: ignore[attr-defined]
    }
    scored: Counter[int] = Counter()
    resolved: Counter[int] = Counter()
    for event in events:
        if event.type == "trajectory.finished" and not event.data.outcome.is_infra_error:  # type: ignore[attr-defined]
            scored[version[event.trajectory_id]] += 1
            resolved[version[event.trajectory_id]] += event.data.outcome == "resolved"  # type: ignore[attr-defined]
    return {v: resolved[v] / scored[v] for v in sorted(scored)}
