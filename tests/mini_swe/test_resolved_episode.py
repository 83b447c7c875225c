"""A whole mini-swe-agent episode that resolves its task: the family's scripted expert, in
mini-swe-agent's tool-calling form, served over the real engine protocol as the model; mini-swe-agent
(unmodified, its own default config) calls it through the gateway, runs its commands in a real
bwrap sandbox and submits; the verifier's reward decides. Every step is on the episode's events."""

from __future__ import annotations

import json

import pytest

from agents.chat import ChatFormat
from agents.engine.policy_server import create_policy_app
from agents.episode import EpisodeSpec
from agents.mini_swe.expert import MiniExpertPolicy
from agents.scaffolds import new_episode
from agents.settings import ExpertSettings
from rollstream.config import Config
from sandboxes.tasks import Task
from streams.assemble import Trajectory, fold_trajectory
from streams.events import Event
from streams.outcomes import Outcome
from streams.payloads import Limits, ToolExecuted, TrajectoryStarted, TurnGenerated
from tests.agents.conftest import Collected
from tests.gateway.conftest import serve
from tests.mini_swe.conftest import MINI_AGENT, mini_services

pytestmark = pytest.mark.slow
READS_THEN_FIXES = ExpertSettings(test_first_rate=1.0, right_edit_rate=1.0)


async def run_one(config: Config, chat: ChatFormat, task: Task, url: str) -> tuple[Collected, Trajectory]:
    sink = Collected()
    async with mini_services(config, chat, url) as services:
        spec = EpisodeSpec("mini", f"g-{task.id}", f"t-{task.id}", task, 0, 0, 1, Limits(max_turns=6))
        await new_episode(spec, services, sink).run()
    folded = fold_trajectory(sink.events)
    assert isinstance(folded, Trajectory)
    return sink, folded


async def test_the_expert_through_mini_swe_agent_resolves_a_family_task(
    base_config: Config, chat: ChatFormat, family_tasks: list[Task]
) -> None:
    task = family_tasks[0]
    expert = MiniExpertPolicy(chat, READS_THEN_FIXES, MINI_AGENT)
    async with serve(create_policy_app(expert)) as url:
        sink, trajectory = await run_one(base_config, chat, task, url)
    events: list[Event] = sink.events
    assert [e.seq for e in events] == list(range(len(events)))
    started = events[0].data
    assert isinstance(started, TrajectoryStarted) and started.scaffold == "mini-swe-agent"
    assert len(started.prompt_token_ids) == 0
    turns = [e.data for e in events if isinstance(e.data, TurnGenerated)]
    tools = [e.data for e in events if isinstance(e.data, ToolExecuted)]
    assert len(turns) == 2 and all(t.drift is None and t.tool_call_error is None for t in turns)
    assert tools[0].command == "python3 run_tests.py" and tools[0].exit_code != 0
    assert "lib.py:" in tools[0].output
    assert "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in tools[1].command
    prompt = chat.decode(list(turns[0].observation_token_ids))
    assert "Please solve this issue" in prompt and '"name": "bash"' in prompt  # mini's prompt, its bash tool
    assert "returncode" in chat.decode(list(turns[1].observation_token_ids))  # mini's observation template
    finished = events[-1].data
    assert finished.outcome == Outcome.RESOLVED and finished.reward == 1.0, finished  # type: ignore[union-attr]
    assert finished.history_drifts == 0 and finished.turns == 2  # type: ignore[union-attr]
    assert trajectory.outcome == Outcome.RESOLVED and trajectory.turns == 2
    trained = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
    assert trained == [*turns[0].output_token_ids, *turns[1].output_token_ids]
    call = chat.decode(list(turns[0].output_token_ids))
    assert (
        json.loads(call[call.index("{") : call.rindex("}") + 1])["arguments"]["command"]
        == "python3 run_tests.py"
    )
