"""The episode's control flow on the simulated sandbox: caps, format errors, submit, aborts,
infrastructure errors, and events that fold into one consistent trajectory."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest

import sandboxes.base
from agents.chat import ChatFormat
from agents.engine.protocol import EngineError
from agents.episode import Episode, EpisodeServices, EpisodeSpec
from agents.scripted import ScriptedPolicy
from agents.settings import AgentSettings
from sandboxes.base import Sandbox, SandboxError
from sandboxes.simulated import SimulatedLatency, SimulatedSandboxFactory
from sandboxes.tasks import Verdict
from sandboxes.tasks.harbor import Task, TaskMetadata
from streams.assemble import fold_trajectory
from streams.outcomes import Outcome, infra_outcome
from streams.payloads import Limits
from tests.agents.conftest import Collected

SUBMIT = AgentSettings().submit_command
FAST = SimulatedLatency(time_scale=0.001)


class DirectSandboxes:
    """Starts and stops sandboxes of one factory (the pool's job, minus its caps)."""

    def __init__(self, factory: SimulatedSandboxFactory) -> None:
        self.factory = factory

    @asynccontextmanager
    async def sandbox(self, workspace: Path | None) -> AsyncIterator[Sandbox]:
        box = self.factory.create(workspace)
        await box.start()
        try:
            yield box
        finally:
            await box.stop()


def make_episode(
    chat: ChatFormat,
    replies: list[str],
    limits: Limits | None = None,
    reward: float = 1.0,
    latency: SimulatedLatency = FAST,
    delay_s: float = 0.0,
    agent_timeout_s: float = 1800.0,
) -> tuple[Episode, Collected]:
    async def verifier(box: Sandbox, task: Task) -> Verdict:
        return Verdict(reward, {"test_fix": reward >= 1.0}, {"test_other": True}, 0.01)

    task = Task(
        "task-1",
        Path("/nonexistent"),
        "Fix the bug.",
        None,
        TaskMetadata(("test_fix",)),
        agent_timeout_s=agent_timeout_s,
    )
    services = EpisodeServices(
        policy=ScriptedPolicy(chat, replies, weight_version=3, delay_s=delay_s),
        sandboxes=DirectSandboxes(SimulatedSandboxFactory(latency)),
        verifier=verifier,
        chat=chat,
        agent=AgentSettings(max_format_errors=2),
        backend="simulated",
        source="test",
        command_timeout_s=10.0,
    )
    spec = EpisodeSpec("run", "group", "traj", task, 0, 0, 8, limits or Limits())
    sink = Collected()
    return Episode(spec, services, sink), sink


def bash(command: str) -> str:
    return f"THOUGHT: go.\n\n```bash\n{command}\n```"


def check_events(sink: Collected) -> None:
    assert [e.seq for e in sink.events] == list(range(len(sink.events)))
    assert len({e.id for e in sink.events}) == len(sink.events)
    trajectory = fold_trajectory(sink.events)
    assert not hasattr(trajectory, "missing"), trajectory


async def test_submit_after_work_is_verified(chat: ChatFormat) -> None:
    episode, sink = make_episode(chat, [bash("ls"), bash(f"git diff\n{SUBMIT}")])
    finished = await episode.run()
    assert finished.outcome == Outcome.RESOLVED and finished.reward == 1.0 and finished.turns == 2
    assert sink.types() == [
        "trajectory.started",
        "sandbox.requested",
        "sandbox.ready",
        "turn.generated",
        "tool.executed",
        "turn.generated",
        "tool.executed",
        "tests.ran",
        "sandbox.released",
        "trajectory.finished",
    ]
    check_events(sink)
    turns = [e.data for e in sink.events if e.type == "turn.generated"]
    assert len(turns[0].observation_token_ids) == 0 and turns[1].observation_token_ids
    assert all(v == 3 for t in turns for v in t.output_versions)
    assert sink.events[-1].policy_version == 3


async def test_wrong_fix_is_unresolved(chat: ChatFormat) -> None:
    episode, _ = make_episode(chat, [bash(SUBMIT)], reward=0.0)
    finished = await episode.run()
    assert finished.outcome == Outcome.UNRESOLVED and finished.reward == 0.0


async def test_never_submitting_ends_at_the_turn_cap(chat: ChatFormat) -> None:
    episode, sink = make_episode(chat, [bash("ls")], Limits(max_turns=5))
    finished = await episode.run()
    assert finished.outcome == Outcome.TRUNCATED_TURNS and finished.turns == 5
    assert "tests.ran" in sink.types() and finished.reward == 1.0  # the verifier still scores it
    check_events(sink)


async def test_agent_time_budget_ends_the_turns_and_the_verifier_still_scores(chat: ChatFormat) -> None:
    episode, sink = make_episode(chat, [bash("ls")], delay_s=0.1, agent_timeout_s=0.35)
    finished = await episode.run()
    assert finished.outcome == Outcome.TRUNCATED_TIME and 2 <= finished.turns <= 5
    assert "tests.ran" in sink.types() and finished.reward == 1.0
    check_events(sink)


async def test_trajectory_token_cap(chat: ChatFormat) -> None:
    limits = Limits(max_new_tokens_per_turn=500, max_trajectory_tokens=40)
    episode, sink = make_episode(chat, [bash("ls")], limits)
    finished = await episode.run()
    assert finished.outcome == Outcome.TRUNCATED_TOKENS and finished.generated_tokens == 40
    check_events(sink)


async def test_context_cap(chat: ChatFormat) -> None:
    prompt_len = len(make_episode(chat, ["x"])[0].services.chat.prompt("a", "b"))
    episode, sink = make_episode(chat, [bash("ls")], Limits(context_cap=prompt_len + 400))
    finished = await episode.run()
    assert finished.outcome == Outcome.TRUNCATED_CONTEXT
    assert finished.context_tokens >= prompt_len and finished.turns >= 1
    check_events(sink)


async def test_format_errors_are_fed_back_then_end_the_episode(chat: ChatFormat) -> None:
    episode, sink = make_episode(chat, ["no block here", bash("ls"), "still none", "none again"])
    finished = await episode.run()
    tools = [e.data for e in sink.events if e.type == "tool.executed"]
    assert [t.format_error for t in tools] == [True, False, True, True]
    assert "no ```bash block" in tools[0].output
    assert finished.turns == 4 and finished.outcome in (Outcome.RESOLVED, Outcome.UNRESOLVED)
    check_events(sink)


async def test_sandbox_start_failure_is_an_infra_error_never_scored(chat: ChatFormat) -> None:
    failing = SimulatedLatency(time_scale=0.001, start_failure_rate=1.0)
    episode, sink = make_episode(chat, [bash(SUBMIT)], latency=failing)
    finished = await episode.run()
    assert finished.outcome == Outcome.INFRA_SANDBOX_START and finished.reward is None
    assert "sandbox.failed" in sink.types() and "tests.ran" not in sink.types()
    assert [e.policy_version for e in sink.events] == [None] * len(sink.events)  # no generation: no version
    check_events(sink)


class SwappingPolicy(ScriptedPolicy):
    """The engine loads the next weight version after every generation (a trainer that keeps up)."""

    async def generate(self, input_ids, params, rid):  # type: ignore[no-untyped-def]
        generation = await super().generate(input_ids, params, rid)
        self.weight_version += 1
        return generation


async def test_events_carry_the_version_in_force_and_none_before_the_first_generation(
    chat: ChatFormat,
) -> None:
    replies = [bash("ls"), bash(SUBMIT)]
    episode, sink = make_episode(chat, replies)
    episode.services = replace(episode.services, policy=SwappingPolicy(chat, replies, weight_version=4))
    await episode.run()
    assert [(e.type, e.policy_version) for e in sink.events] == [
        ("trajectory.started", None),
        ("sandbox.requested", None),
        ("sandbox.ready", None),
        ("turn.generated", 4),
        ("tool.executed", 4),
        ("turn.generated", 5),  # the submit: no command to run
        ("tests.ran", 5),
        ("sandbox.released", 5),
        ("trajectory.finished", 5),
    ]
    assert fold_trajectory(sink.events).oldest_version == 4  # type: ignore[union-attr]


async def test_abort_ends_the_episode_promptly_as_deadline(chat: ChatFormat) -> None:
    episode, sink = make_episode(chat, [bash("sleep 1")], delay_s=30.0)
    task = asyncio.create_task(episode.run())
    for _ in range(200):
        await asyncio.sleep(0.02)
        if "turn.generated" in sink.types() or episode._rid is not None:
            break
    episode.abort("group_deadline")
    finished = await asyncio.wait_for(task, timeout=10)
    assert finished.outcome == Outcome.TRUNCATED_DEADLINE and finished.reward == 0.0
    assert episode.services.policy.aborted == ["traj:1"]  # the in-flight request was aborted
    assert sink.types()[-2:] == ["sandbox.released", "trajectory.finished"]
    check_events(sink)


async def test_shutdown_cancel_writes_nothing_more(chat: ChatFormat) -> None:
    episode, sink = make_episode(chat, [bash("ls")], delay_s=30.0)
    task = asyncio.create_task(episode.run())
    while episode._rid is None:
        await asyncio.sleep(0.01)
    written = len(sink.events)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(sink.events) == written


def test_sandbox_error_kinds_map_to_outcomes() -> None:
    assert SandboxError("x").kind == "sandbox_lost"
    errors = [c for c in vars(sandboxes.base).values() if isinstance(c, type) and issubclass(c, SandboxError)]
    assert len(errors) >= 6  # SandboxError, its four kinds and BackendUnavailableError
    for cls in errors:
        # infra_outcome raises ValueError on a kind that is not an Outcome
        assert infra_outcome(cls("x", backend="test").kind).is_infra_error, cls


class RefusingPolicy(ScriptedPolicy):
    """Answers turn 1, then the engine fails with `kind` (its context cap, or the network)."""

    def __init__(self, chat: ChatFormat, kind: str) -> None:
        super().__init__(chat, [bash("ls")])
        self.kind = kind

    async def generate(self, input_ids, params, rid):  # type: ignore[no-untyped-def]
        if rid.endswith(":2"):
            raise EngineError(self.kind, "refused")  # type: ignore[arg-type]
        return await super().generate(input_ids, params, rid)


@pytest.mark.parametrize(
    ("kind", "outcome", "reward"),
    [
        ("context", Outcome.TRUNCATED_CONTEXT, 1.0),
        ("network", Outcome.INFRA_NETWORK, None),
        ("engine", Outcome.INFRA_ENGINE, None),
    ],
)
async def test_engine_errors_map_to_outcomes(
    chat: ChatFormat, kind: str, outcome: Outcome, reward: float | None
) -> None:
    episode, sink = make_episode(chat, ["unused"])
    episode.services = replace(episode.services, policy=RefusingPolicy(chat, kind))
    finished = await episode.run()
    assert (finished.outcome, finished.reward, finished.turns) == (outcome, reward, 1)
    assert ("tests.ran" in {e.type for e in sink.events}) == (reward is not None)  # caps are verified
    check_events(sink)


async def test_verifier_failure_is_an_infra_error_and_the_sandbox_is_still_released(chat: ChatFormat) -> None:
    async def crashing(box: Sandbox, task: Task) -> Verdict:
        raise sandboxes.base.VerifierError("no reward file")

    episode, sink = make_episode(chat, [bash(SUBMIT)])
    episode.services = replace(episode.services, verifier=crashing)
    finished = await episode.run()
    assert (finished.outcome, finished.reward) == (Outcome.INFRA_VERIFIER, None)
    assert finished.error is not None and "no reward file" in finished.error
    assert "tests.ran" not in sink.types() and "sandbox.failed" not in sink.types()
    assert sink.types()[-2:] == ["sandbox.released", "trajectory.finished"]
    check_events(sink)
