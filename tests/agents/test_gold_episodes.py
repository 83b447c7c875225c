"""Whole episodes on the default task set through the real bwrap sandbox pool and verifier.

A scripted policy that applies each task's gold fix (`solution/solve.sh`, run as one
bash block) and then submits is scored 1 on every task; one that never submits ends
at the turn cap as `truncated:turns`. Episodes run directly (no Kafka) to stay quick.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agents.chat import ChatFormat
from agents.episode import Episode, EpisodeServices, EpisodeSpec
from agents.scripted import ScriptedPolicy
from rollstream.config import Config
from sandboxes.backends import make_factory
from sandboxes.base import Sandbox
from sandboxes.pool import SandboxPool
from sandboxes.tasks import Task, Verdict, load_tasks, run_verifier
from streams.outcomes import Outcome
from streams.payloads import Limits, TrajectoryFinished
from tests.agents.conftest import Collected

pytestmark = pytest.mark.slow
AT_ONCE = 3  # episodes in parallel: the machine has 2 cores


async def verify(box: Sandbox, task: Task) -> Verdict:
    return await run_verifier(box, task, task.verifier_timeout_s)


async def run_scripted(
    config: Config, pool: SandboxPool, chat: ChatFormat, task: Task, replies: list[str], limits: Limits
) -> tuple[TrajectoryFinished, Collected]:
    services = EpisodeServices(
        policy=ScriptedPolicy(chat, replies),
        sandboxes=pool,
        verifier=verify,
        chat=chat,
        agent=config.agent,
        backend=config.sandbox.backend,
        source="test-gold",
        command_timeout_s=120.0,
    )
    sink = Collected()
    spec = EpisodeSpec("gold", f"g-{task.id}", f"t-{task.id}", task, 0, 0, 1, limits)
    return await Episode(spec, services, sink).run(), sink


def gold_reply(task: Task) -> str:
    return f"THOUGHT: apply the fix.\n\n```bash\n{task.solution_script.read_text().strip()}\n```"


SUBMIT_REPLY = "THOUGHT: done.\n\n```bash\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


async def test_gold_fix_then_submit_resolves_every_default_task(
    base_config: Config, default_tasks_dir: Path, chat: ChatFormat
) -> None:
    tasks = load_tasks(default_tasks_dir)
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(task: Task) -> tuple[TrajectoryFinished, Collected]:
        async with gate:
            replies = [gold_reply(task), SUBMIT_REPLY]
            return await run_scripted(base_config, pool, chat, task, replies, Limits())

    async with SandboxPool(base_config.sandbox, make_factory(base_config.sandbox)) as pool:
        results = await asyncio.gather(*(one(task) for task in tasks))
    for task, (finished, sink) in zip(tasks, results, strict=True):
        fix = next(e.data for e in sink.events if e.type == "tool.executed")
        assert fix.exit_code == 0, f"{task.id}: the gold fix failed: {fix.output}"
        assert (finished.outcome, finished.reward) == (Outcome.RESOLVED, 1.0), f"{task.id}: {finished}"
        tests = next(e.data for e in sink.events if e.type == "tests.ran")
        assert all(tests.fail_to_pass.values()) and tests.reward == 1.0, task.id
        assert finished.turns == 2


async def test_agent_that_never_submits_ends_at_the_turn_cap(
    base_config: Config, default_tasks_dir: Path, chat: ChatFormat
) -> None:
    task = load_tasks(default_tasks_dir)[0]
    reply = "THOUGHT: keep looking.\n\n```bash\nls\n```"
    async with SandboxPool(base_config.sandbox, make_factory(base_config.sandbox)) as pool:
        finished, sink = await run_scripted(base_config, pool, chat, task, [reply], Limits(max_turns=4))
    assert finished.outcome == Outcome.TRUNCATED_TURNS and finished.turns == 4
    assert finished.reward == 0.0  # verified: the bug is still there
    assert [e.seq for e in sink.events] == list(range(len(sink.events)))
    assert sum(e.type == "tool.executed" for e in sink.events) == 4
