"""Episodes and runs as the rollout worker writes them, and a run of every stored type
(see `streams.eventgen`). Pure: times come from the arguments, randomness from seeds."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

from streams.events import Event, make_event
from streams.outcomes import Outcome
from streams.payloads import (
    GroupFormed,
    Limits,
    Payload,
    SandboxFailed,
    SandboxReady,
    SandboxReleased,
    SandboxRequested,
    TestsRan,
    ToolExecuted,
    TrainerStep,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
    WeightsPublished,
)
from streams.settings import PolicySettings

# ---- episodes and runs, as the rollout worker writes them ------------------------

NS = 1_000_000_000
VOCAB = 32_000


@dataclass(frozen=True)
class AttemptSpec:
    """One episode to write: which attempt, how it ends, how long each turn takes."""

    attempt: int
    retry: int = 0
    turns: int = 3
    outcome: Outcome = Outcome.RESOLVED
    reward: float | None = 1.0
    version: int = 0
    output_tokens: int = 8
    observation_tokens: int = 6
    start_s: float = 0.0
    turn_s: float = 1.0
    group_size: int = 8


def trajectory_id_of(group_id: str, attempt: int, retry: int = 0) -> str:
    return f"{group_id}/a{attempt}r{retry}"


def trajectory_events(
    run_id: str,
    group_id: str,
    spec: AttemptSpec,
    *,
    t0_ns: int = 1_700_000_000 * NS,
    limits: Limits | None = None,
    source: str = "rollout-0",
) -> list[Event]:
    """The events of one episode, in seq order."""
    trajectory_id = trajectory_id_of(group_id, spec.attempt, spec.retry)
    time_ns = t0_ns + int(spec.start_s * NS)
    events = []
    generated = False  # as an episode's: no version on its events until a generation reported one
    for seq, (data, advance_s) in enumerate(_payloads(spec, trajectory_id, limits or Limits())):
        time_ns += int(advance_s * NS)
        generated = generated or isinstance(data, TurnGenerated)
        events.append(
            make_event(
                data,
                run_id=run_id,
                seq=seq,
                time_ns=time_ns,
                source=source,
                group_id=group_id,
                trajectory_id=trajectory_id,
                task_id=group_id.split("/")[-1],
                policy_version=spec.version if generated else None,
            )
        )
    return events


def _payloads(spec: AttemptSpec, trajectory_id: str, limits: Limits) -> list[tuple[Payload, float]]:
    """(payload, seconds since the previous event) of each event of the episode."""
    rng = random.Random(trajectory_id)
    prompt = [rng.randrange(VOCAB) for _ in range(12)]
    out: list[tuple[Payload, float]] = [
        (
            TrajectoryStarted(
                attempt=spec.attempt,
                retry=spec.retry,
                group_size=spec.group_size,
                limits=limits,
                prompt_token_ids=prompt,
            ),
            0.0,
        ),
        (SandboxRequested(backend="simulated"), 0.0),
    ]
    if spec.outcome.is_infra_error and spec.outcome != Outcome.INFRA_VERIFIER:
        kind = spec.outcome.value.split(":")[1]
        out.append((SandboxFailed(backend="simulated", error_kind=kind, message="simulated failure"), 0.5))
        out.append((_finished(spec, len(out), turns=0, generated=0, context=len(prompt)), 0.0))
        return out
    sandbox = f"sb-{trajectory_id}"
    out.append((SandboxReady(backend="simulated", sandbox_id=sandbox, queue_wait_s=0.1, start_s=0.4), 0.5))
    turns = _turn_payloads(spec, rng, len(prompt))
    out += turns
    if spec.outcome != Outcome.INFRA_VERIFIER:
        tests = TestsRan(
            fail_to_pass={"test_fix": spec.outcome == Outcome.RESOLVED},
            pass_to_pass={"test_old": True},
            duration_s=0.2,
            reward=spec.reward or 0.0,
        )
        out.append((tests, 0.2))
    out.append((SandboxReleased(backend="simulated", sandbox_id=sandbox, lifetime_s=1.0), 0.0))
    outputs = [t for t, _ in turns if isinstance(t, TurnGenerated)]
    context = outputs[-1].context_tokens if outputs else len(prompt)
    generated = sum(len(t.output_token_ids) for t in outputs)
    out.append((_finished(spec, len(out), turns=spec.turns, generated=generated, context=context), 0.0))
    return out


def _turn_payloads(spec: AttemptSpec, rng: random.Random, context: int) -> list[tuple[Payload, float]]:
    """Each turn's `turn.generated` (70% of the turn time) and `tool.executed` (30%)."""
    out: list[tuple[Payload, float]] = []
    llm_s, tool_s = spec.turn_s * 0.7, spec.turn_s * 0.3
    for turn in range(1, spec.turns + 1):
        observation = [] if turn == 1 else [rng.randrange(VOCAB) for _ in range(spec.observation_tokens)]
        output = [rng.randrange(VOCAB) for _ in range(spec.output_tokens)]
        context += len(observation) + len(output)
        generated = TurnGenerated(
            turn=turn,
            observation_token_ids=observation,
            output_token_ids=output,
            output_logprobs=[-rng.random() for _ in output],
            output_versions=[spec.version] * len(output),
            finish_reason="stop",
            engine_id="engine-0",
            weight_version=spec.version,
            context_tokens=context,
            queue_wait_s=0.01,
            latency_s=llm_s,
        )
        tool = ToolExecuted(
            turn=turn,
            command=f"ls step{turn}",
            exit_code=0,
            output=f"file{turn}.py\n",
            output_bytes=12,
            truncated=False,
            duration_s=tool_s,
        )
        out += [(generated, llm_s), (tool, tool_s)]
    return out


def _finished(spec: AttemptSpec, seq: int, *, turns: int, generated: int, context: int) -> TrajectoryFinished:
    reward = None if spec.outcome.is_infra_error else spec.reward
    return TrajectoryFinished(
        outcome=spec.outcome,
        reward=reward,
        turns=turns,
        generated_tokens=generated,
        context_tokens=context,
        last_seq=seq,
    )


def group_events(
    run_id: str,
    group_id: str,
    specs: list[AttemptSpec],
    *,
    t0_ns: int = 1_700_000_000 * NS,
    limits: Limits | None = None,
) -> list[Event]:
    """Every event of a group's episodes, interleaved in time order as a rollout fleet writes them."""
    events = [
        e for spec in specs for e in trajectory_events(run_id, group_id, spec, t0_ns=t0_ns, limits=limits)
    ]
    return sorted(events, key=lambda e: (e.time_ns, e.trajectory_id or "", e.seq))


def random_attempts(
    rng: random.Random,
    group_size: int,
    *,
    max_turns: int = 12,
    version: int = 0,
    infra_rate: float = 0.03,
    truncated_rate: float = 0.1,
) -> list[AttemptSpec]:
    """A group's attempts: mostly resolved/unresolved, some truncated, infra errors re-run once."""
    specs = []
    for attempt in range(group_size):
        start = rng.random() * 2
        if rng.random() < infra_rate:
            specs.append(
                AttemptSpec(
                    attempt,
                    0,
                    0,
                    Outcome.INFRA_SANDBOX_START,
                    None,
                    version,
                    start_s=start,
                    group_size=group_size,
                )
            )
            specs.append(
                _scored(rng, attempt, 1, max_turns, version, start + 1.0, group_size, truncated_rate)
            )
        else:
            specs.append(_scored(rng, attempt, 0, max_turns, version, start, group_size, truncated_rate))
    return specs


def _scored(
    rng: random.Random,
    attempt: int,
    retry: int,
    max_turns: int,
    version: int,
    start: float,
    group_size: int,
    truncated_rate: float,
) -> AttemptSpec:
    if rng.random() < truncated_rate:
        return AttemptSpec(
            attempt,
            retry,
            max_turns,
            Outcome.TRUNCATED_TURNS,
            0.0,
            version,
            start_s=start,
            turn_s=0.5 + rng.random(),
            group_size=group_size,
        )
    resolved = rng.random() < 0.4
    return AttemptSpec(
        attempt,
        retry,
        rng.randint(1, max_turns - 1),
        Outcome.RESOLVED if resolved else Outcome.UNRESOLVED,
        1.0 if resolved else 0.0,
        version,
        start_s=start,
        turn_s=0.5 + rng.random(),
        group_size=group_size,
    )


def synthetic_run(
    run_id: str,
    groups: int,
    group_size: int = 8,
    *,
    seed: int = 0,
    max_turns: int = 12,
    t0_ns: int = 1_700_000_000 * NS,
) -> list[Event]:
    """A run's rollout events, group after group (each group's events in time order)."""
    rng = random.Random(seed)
    events: list[Event] = []
    for index in range(groups):
        specs = random_attempts(rng, group_size, max_turns=max_turns)
        events += group_events(
            run_id,
            f"{run_id}/g{index:06d}",
            specs,
            t0_ns=t0_ns + index * NS,
            limits=Limits(max_turns=max_turns),
        )
    return events


def weights_event(run_id: str, version: int, time_ns: int) -> Event:
    return make_event(
        WeightsPublished(version=version, path=f"/weights/v{version}", step=version),
        run_id=run_id,
        seq=version,
        time_ns=time_ns,
        source="trainer",
        id_key=f"weights:{run_id}",
    )


# ---- every stored type: the store and sink tests ------------------------------------

STORE_RUN_ID = "run-test"
STORE_T0_NS = 1_790_000_000 * NS
STORE_GROUP_SIZE = 4
TOPIC_OF_TYPE = {
    "weights.published": "weights.history",
    "trainer.step": "trainer.steps",
    "group.formed": "groups",
}


def short_topic(event: Event) -> str:
    """The short topic `event` belongs on."""
    return TOPIC_OF_TYPE.get(event.type, "rollout.events")


def generate_events(n: int, seed: int = 7, run_id: str = STORE_RUN_ID) -> list[Event]:
    """Exactly `n` events of every stored type (the last group may be cut short): groups of
    `random_attempts` episodes, a `group.formed` after each, a step and a weight version every 3."""
    rng = random.Random(seed)
    events: list[Event] = []
    version = 0
    for index in itertools.count():
        group_id = f"{run_id}/g{index:05d}"
        t0_ns = STORE_T0_NS + index * 60 * NS
        max_turns = rng.choice([4, 12])
        specs = random_attempts(rng, STORE_GROUP_SIZE, max_turns=max_turns, version=version, infra_rate=0.05)
        episodes = group_events(run_id, group_id, specs, t0_ns=t0_ns, limits=Limits(max_turns=max_turns))
        events += episodes
        events.append(_group_formed(run_id, group_id, episodes, version))
        if index % 3 == 2:
            version += 1
            last_ns = events[-1].time_ns
            events += [
                _trainer_step(rng, run_id, version, last_ns + NS),
                weights_event(run_id, version, last_ns + 2 * NS),
            ]
        if len(events) >= n:
            return events[:n]
    raise AssertionError("unreachable: the run is endless")


def _group_formed(run_id: str, group_id: str, episodes: list[Event], version: int) -> Event:
    finished = [e for e in episodes if isinstance(e.data, TrajectoryFinished) and e.data.reward is not None]
    rewards = [e.data.reward or 0.0 for e in finished]  # type: ignore[union-attr]
    return make_event(
        GroupFormed(
            members=[e.trajectory_id or "" for e in finished],
            rewards=rewards,
            advantages=[r - 0.5 for r in rewards],
            policy=PolicySettings(),
        ),
        run_id=run_id,
        seq=0,
        time_ns=max(e.time_ns for e in episodes) + 1,
        source="streams-0",
        group_id=group_id,
        task_id=group_id.split("/")[-1],
        id_key=f"group:{group_id}",
        policy_version=version,
    )


def _trainer_step(rng: random.Random, run_id: str, version: int, time_ns: int) -> Event:
    return make_event(
        TrainerStep(
            step=version,
            version=version,
            groups=3,
            trajectories=3 * STORE_GROUP_SIZE,
            loss=rng.uniform(-0.1, 0.1),
            grad_norm=rng.uniform(0.01, 0.3),
            mean_logprob_diff=rng.uniform(0.005, 0.02),
            ess=rng.uniform(0.85, 0.99),
        ),
        run_id=run_id,
        seq=version,
        time_ns=time_ns,
        source="trainer",
        policy_version=version,
        id_key="trainer:steps",
    )
