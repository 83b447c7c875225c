"""One plausible event of any type, deterministic from (kind, index, tokens) (see `streams.eventgen`)."""

from __future__ import annotations

import random
from collections.abc import Callable

from streams.events import BEFORE_ANY_TURN, PAYLOADS, ROLLOUT_EVENT_TYPES, Event, make_event
from streams.outcomes import Outcome
from streams.payloads import (
    DeadLetterRecord,
    GroupFormed,
    Limits,
    Payload,
    RolloutAbort,
    RolloutRequested,
    SandboxFailed,
    SandboxReady,
    SandboxReleased,
    SandboxRequested,
    StepTimes,
    TestsRan,
    TimeBreakdown,
    ToolExecuted,
    TrainerStep,
    TrajectoryAssembled,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
    WeightsPublished,
)
from streams.settings import PolicySettings

# A rollout-heavy mix: per episode one start, a sandbox lifecycle, many turns and tool calls.
BENCH_MIX: dict[str, int] = {
    "turn.generated": 30,
    "tool.executed": 30,
    "trajectory.started": 3,
    "sandbox.requested": 3,
    "sandbox.ready": 3,
    "sandbox.released": 3,
    "tests.ran": 3,
    "trajectory.finished": 3,
    "rollout.requested": 3,
    "trainer.step": 1,
}
TIMES = TimeBreakdown(llm_s=41.5, tool_s=12.25, sandbox_start_s=3.5, tests_s=8.0, total_s=66.0)
POLICY = PolicySettings(max_turns=80, max_staleness=4, overlong="mask", drop_zero_variance=True)
OUTPUT = "FAILED tests/test_core.py::test_parse - AssertionError: expected 3 got 4\n" * 12


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, 151_000) for _ in range(n)]


def sample_payload(kind: str, i: int, tokens: int = 300) -> Payload:
    """A plausible payload of `kind`; `tokens` sizes the token arrays."""
    rng = random.Random(f"{kind}#{i}")
    if kind in ROLLOUT_EVENT_TYPES:
        return _rollout_payload(kind, i, tokens, rng)
    return _derived_payload(kind, i, tokens, rng)


def _rollout_payload(kind: str, i: int, tokens: int, rng: random.Random) -> Payload:
    limits = Limits()
    times = TIMES
    builders: dict[str, Callable[[], Payload]] = {
        "trajectory.started": lambda: TrajectoryStarted(
            attempt=i % 8, group_size=8, limits=limits, prompt_token_ids=_tokens(rng, tokens)
        ),
        "sandbox.requested": lambda: SandboxRequested(backend="bwrap"),
        "sandbox.ready": lambda: SandboxReady(
            backend="bwrap", sandbox_id=f"sb-{i}", queue_wait_s=rng.random(), start_s=rng.random() * 3
        ),
        "sandbox.failed": lambda: SandboxFailed(
            backend="docker", error_kind="sandbox_start", message="no free network", queue_wait_s=2.0
        ),
        "sandbox.released": lambda: SandboxReleased(backend="bwrap", sandbox_id=f"sb-{i}", lifetime_s=60.0),
        "turn.generated": lambda: TurnGenerated(
            turn=i % 80 + 1,
            observation_token_ids=_tokens(rng, tokens // 3),
            output_token_ids=_tokens(rng, tokens),
            output_logprobs=[-rng.random() * 4 for _ in range(tokens)],
            output_versions=[3] * tokens,
            finish_reason="stop",
            engine_id="engine-0",
            weight_version=3,
            context_tokens=4000 + i % 60_000,
            queue_wait_s=0.01,
            latency_s=rng.random() * 5,
        ),
        "tool.executed": lambda: ToolExecuted(
            turn=i % 80 + 1,
            command="python -m pytest -x tests/test_core.py",
            exit_code=rng.choice([0, 1, 2]),
            output=OUTPUT[: 200 + i % 800],
            output_bytes=1000 + i,
            truncated=i % 5 == 0,
            duration_s=rng.random() * 10,
        ),
        "tests.ran": lambda: TestsRan(
            fail_to_pass={"tests/test_core.py::test_parse": i % 2 == 0},
            pass_to_pass={f"tests/test_core.py::test_{k}": True for k in range(5)},
            duration_s=8.0,
            reward=float(i % 2 == 0),
        ),
        "trajectory.finished": lambda: TrajectoryFinished(
            outcome=list(Outcome)[i % len(Outcome)],
            reward=None if list(Outcome)[i % len(Outcome)].is_infra_error else float(i % 2),
            turns=i % 80,
            generated_tokens=i % 65_536,
            context_tokens=4000,
            last_seq=i % 200 + 3,
            times=times,
        ),
    }
    return builders[kind]()


def _derived_payload(kind: str, i: int, tokens: int, rng: random.Random) -> Payload:
    times, policy = TIMES, POLICY
    builders: dict[str, Callable[[], Payload]] = {
        "trajectory.assembled": lambda: _assembled(rng, i, tokens, times, policy),
        "group.formed": lambda: GroupFormed(
            members=[f"traj-{i}-{k}" for k in range(8)],
            rewards=[float(k % 2) for k in range(8)],
            advantages=[(k % 2) - 0.5 for k in range(8)],
            dropped=None if i % 4 else "zero_variance",
            oldest_version=2,
            policy=policy,
        ),
        "rollout.requested": lambda: RolloutRequested(task_dir=f"task-{i % 50}", attempt=i % 8, group_size=8),
        "rollout.abort": lambda: RolloutAbort(trajectory_ids=[f"traj-{i}-{k}" for k in range(3)]),
        "weights.published": lambda: WeightsPublished(version=i, path=f".rollstream/weights/v{i}", step=i),
        "trainer.step": lambda: TrainerStep(
            step=i,
            version=i + 1,
            groups=4,
            trajectories=32,
            loss=0.01,
            grad_norm=0.07,
            ess=0.93,
            times=StepTimes(wait_s=0.5, logprob_s=1.5, update_s=2.5, publish_s=0.5, total_s=5.0),
        ),
        "deadletter.record": lambda: DeadLetterRecord(
            reason="not JSON",
            topic="rollout.events",
            partition=i % 6,
            offset=i,
            key_b64=None,
            value_b64="bm90IGpzb24=",
            consumer="sink",
        ),
    }
    return builders[kind]()


def _assembled(
    rng: random.Random, i: int, tokens: int, times: TimeBreakdown, policy: PolicySettings
) -> TrajectoryAssembled:
    total = tokens * 3
    mask = [0] * tokens + [1] * (total - tokens)
    return TrajectoryAssembled(
        attempt=i % 8,
        outcome=Outcome.RESOLVED,
        reward=1.0,
        token_ids=_tokens(rng, total),
        loss_mask=mask,
        rollout_logprobs=[-rng.random() if m else 0.0 for m in mask],
        token_versions=[3 if m else -1 for m in mask],
        prompt_tokens=tokens,
        turns=4,
        generated_tokens=total - tokens,
        context_tokens=total,
        times=times,
        policy=policy,
    )


def sample_event(kind: str, i: int, tokens: int = 300, run_id: str = "run-sample") -> Event:
    """Event `i` of `kind`: ids, groups and seqs as a real run would have them."""
    group = f"{run_id}/g{i // 64}"
    trajectory = f"{group}/a{i % 8}"
    return make_event(
        sample_payload(kind, i, tokens),
        run_id=run_id,
        seq=i,
        time_ns=1_800_000_000_000_000_000 + i * 1000,
        source="sampler",
        group_id=group if kind in _GROUPED else None,
        trajectory_id=trajectory if kind in _GROUPED else None,
        task_id=f"task-{i % 50}",
        policy_version=None if kind in BEFORE_ANY_TURN else 3,  # as an episode writes them
        id_key=f"{kind}:{trajectory}",
    )


_GROUPED = frozenset(PAYLOADS) - {"weights.published", "trainer.step", "deadletter.record", "rollout.abort"}


def bench_mix(count: int, tokens: int = 300) -> list[Event]:
    """`count` events drawn from `BENCH_MIX` in a fixed order."""
    kinds = [kind for kind, weight in BENCH_MIX.items() for _ in range(weight)]
    rng = random.Random(7)
    return [sample_event(rng.choice(kinds), i, tokens) for i in range(count)]
