"""Realistic events of every type the sink stores, deterministic from a seed.

`generate_events(n)` simulates GRPO groups of episodes (trajectory.started,
sandbox.*, turn.generated + tool.executed per turn, tests.ran,
trajectory.finished, including sandbox failures scored as infra errors), with a
weights.published and a trainer.step after every few groups, and a
group.formed per group, until exactly `n` events exist. `short_topic(event)`
says which topic each one belongs on.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from streams.events import Event, make_event
from streams.outcomes import Outcome
from streams.payloads import (
    GroupFormed,
    Limits,
    SandboxFailed,
    SandboxReady,
    SandboxReleased,
    SandboxRequested,
    TestsRan,
    TimeBreakdown,
    ToolExecuted,
    TrainerStep,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
    WeightsPublished,
)

RUN_ID = "run-test"
BASE_NS = 1_790_000_000_000_000_000
TOPIC_OF_TYPE = {
    "weights.published": "weights.history",
    "trainer.step": "trainer.steps",
    "group.formed": "groups",
}
COMMANDS = ("ls -la", "cat setup.py", "grep -rn 'def parse' src/", "python -m pytest -x tests/", "git diff")


def short_topic(event: Event) -> str:
    return TOPIC_OF_TYPE.get(event.type, "rollout.events")


class _Clock:
    def __init__(self) -> None:
        self.now = BASE_NS

    def tick(self, rng: random.Random) -> int:
        self.now += rng.randint(1_000_000, 2_000_000_000)
        return self.now


def generate_events(n: int, seed: int = 7, run_id: str = RUN_ID) -> list[Event]:
    """Exactly `n` events of every stored type (the last episode may be cut short)."""
    events: list[Event] = []
    for event in _stream(random.Random(seed), run_id):
        events.append(event)
        if len(events) == n:
            return events
    raise AssertionError("unreachable: the stream is endless")


def _stream(rng: random.Random, run_id: str) -> Iterator[Event]:
    clock = _Clock()
    version = 0
    for group_index in range(1_000_000):
        group_id = f"g{group_index:05d}"
        task_id = f"task-{group_index % 37:03d}"
        members = []
        rewards = []
        for attempt in range(4):
            trajectory_id = f"{group_id}-a{attempt}"
            members.append(trajectory_id)
            episode = _episode(rng, clock, run_id, group_id, task_id, trajectory_id, attempt, version)
            yield from episode
            finished = episode[-1].data
            assert isinstance(finished, TrajectoryFinished)
            rewards.append(finished.reward or 0.0)
        yield make_event(
            GroupFormed(members=members, rewards=rewards, advantages=[r - 0.5 for r in rewards], policy={}),
            run_id=run_id,
            seq=group_index,
            time_ns=clock.tick(rng),
            source="streams-0",
            group_id=group_id,
            task_id=task_id,
            id_key=f"group:{group_id}",
            policy_version=version,
        )
        if group_index % 3 == 2:
            version += 1
            yield from _training_step(rng, clock, run_id, version)


def _training_step(rng: random.Random, clock: _Clock, run_id: str, version: int) -> Iterator[Event]:
    yield make_event(
        TrainerStep(
            step=version,
            version=version,
            groups=3,
            trajectories=12,
            loss=rng.uniform(-0.1, 0.1),
            grad_norm=rng.uniform(0.01, 0.3),
            mean_logprob_diff=rng.uniform(0.005, 0.02),
            ess=rng.uniform(0.85, 0.99),
            times={"forward_s": rng.uniform(1, 5), "optimizer_s": 0.4},
        ),
        run_id=run_id,
        seq=version,
        time_ns=clock.tick(rng),
        source="trainer",
        policy_version=version,
        id_key="trainer:steps",
    )
    yield make_event(
        WeightsPublished(version=version, path=f"/ckpt/v{version:05d}", step=version),
        run_id=run_id,
        seq=version,
        time_ns=clock.tick(rng),
        source="trainer",
        policy_version=version,
        id_key="trainer:weights",
    )


def _episode(
    rng: random.Random,
    clock: _Clock,
    run_id: str,
    group_id: str,
    task_id: str,
    trajectory_id: str,
    attempt: int,
    version: int,
) -> list[Event]:
    out: list[Event] = []

    def emit(data: object, causation: Event | None = None) -> Event:
        event = make_event(
            data,  # type: ignore[arg-type]
            run_id=run_id,
            seq=len(out),
            time_ns=clock.tick(rng),
            source="rollout-0",
            group_id=group_id,
            trajectory_id=trajectory_id,
            task_id=task_id,
            policy_version=version,
            causation_id=causation.id if causation else None,
        )
        out.append(event)
        return event

    limits = Limits(max_turns=rng.choice([8, 80]))
    prompt = [rng.randrange(50_000) for _ in range(rng.randint(30, 120))]
    emit(TrajectoryStarted(attempt=attempt, group_size=4, limits=limits, prompt_token_ids=prompt))
    requested = emit(SandboxRequested(backend="bwrap"))
    if rng.random() < 0.05:
        emit(
            SandboxFailed(
                backend="bwrap", error_kind="sandbox_start", message="bwrap: exit 1", queue_wait_s=0.2
            )
        )
        _finish(emit, Outcome.INFRA_SANDBOX_START, None, 0, 0, len(out))
        return out
    emit(
        SandboxReady(backend="bwrap", sandbox_id=f"sb-{trajectory_id}", queue_wait_s=0.1, start_s=0.8),
        requested,
    )
    turns, tokens = _turns(rng, emit, limits.max_turns, version)
    f2p = {f"test_fix_{i}": rng.random() < 0.5 for i in range(rng.randint(1, 3))}
    p2p = {f"test_keep_{i}": rng.random() < 0.95 for i in range(rng.randint(0, 5))}
    reward = 1.0 if all(f2p.values()) and all(p2p.values()) else 0.0
    emit(TestsRan(fail_to_pass=f2p, pass_to_pass=p2p, duration_s=rng.uniform(1, 30), reward=reward))
    emit(SandboxReleased(backend="bwrap", sandbox_id=f"sb-{trajectory_id}", lifetime_s=rng.uniform(10, 900)))
    outcome = Outcome.RESOLVED if reward else Outcome.UNRESOLVED
    if turns == limits.max_turns:
        outcome, reward = Outcome.TRUNCATED_TURNS, 0.0
    _finish(emit, outcome, reward, turns, tokens, len(out))
    return out


def _turns(rng: random.Random, emit: object, max_turns: int, version: int) -> tuple[int, int]:
    turns = min(max_turns, rng.randint(1, 12))
    tokens = 0
    context = 0
    for turn in range(1, turns + 1):
        observation = [rng.randrange(50_000) for _ in range(rng.randint(10, 200))]
        output = [rng.randrange(50_000) for _ in range(rng.randint(5, 150))]
        tokens += len(output)
        context += len(observation) + len(output)
        generated = emit(  # type: ignore[operator]
            TurnGenerated(
                turn=turn,
                observation_token_ids=observation,
                output_token_ids=output,
                output_logprobs=[-rng.expovariate(3.0) for _ in output],
                output_versions=[max(0, version - rng.randint(0, 1)) for _ in output],
                finish_reason=rng.choice(["stop", "stop", "length"]),
                engine_id=f"engine-{turn % 2}",
                weight_version=version,
                context_tokens=context,
                queue_wait_s=rng.uniform(0, 0.5),
                latency_s=rng.uniform(0.2, 8.0),
            )
        )
        shown = "".join(rng.choice("abcdefgh \n") for _ in range(rng.randint(0, 400)))
        emit(  # type: ignore[operator]
            ToolExecuted(
                turn=turn,
                command=rng.choice(COMMANDS),
                exit_code=rng.choice([0, 0, 1, None]),
                output=shown,
                output_bytes=len(shown) + rng.choice([0, 0, 50_000]),
                truncated=rng.random() < 0.2,
                duration_s=rng.uniform(0.01, 20),
                timed_out=rng.random() < 0.03,
                format_error=rng.random() < 0.02,
            ),
            generated,
        )
    return turns, tokens


def _finish(emit: object, outcome: Outcome, reward: float | None, turns: int, tokens: int, seq: int) -> None:
    times = TimeBreakdown(
        llm_s=turns * 2.0, tool_s=turns * 0.5, sandbox_start_s=0.8, tests_s=3.0, total_s=60.0
    )
    data = TrajectoryFinished(
        outcome=outcome,
        reward=reward,
        turns=turns,
        generated_tokens=tokens,
        context_tokens=tokens * 3,
        last_seq=seq,
        error="bwrap: exit 1" if outcome.is_infra_error else None,
        times=times,
    )
    emit(data)  # type: ignore[operator]
