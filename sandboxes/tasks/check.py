"""`tasks check`: a task is valid when its gold solution scores 1 and no change scores 0.

Each task gets two fresh sandboxes over its workspace: one runs `solution/solve.sh`
then the verifier, the other only the verifier. A `SandboxError` (a verifier that
crashed, a sandbox that would not start) makes the task invalid with the error named,
never a reward.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sandboxes.base import SandboxError, SandboxFactory, create_sandbox
from sandboxes.tasks.harbor import Task
from sandboxes.tasks.verifier import run_verifier, workspace_root

SOLVE_NAME = ".rollstream-solve.sh"
SOLVE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class CheckResult:
    task_id: str
    gold_reward: float | None
    none_reward: float | None
    error: str = ""
    duration_s: float = 0.0

    @property
    def valid(self) -> bool:
        return not self.error and self.gold_reward == 1.0 and self.none_reward == 0.0

    @property
    def problem(self) -> str:
        if self.error:
            return self.error
        problems = []
        if self.gold_reward != 1.0:
            problems.append(f"gold solution scores {self.gold_reward}, expected 1")
        if self.none_reward != 0.0:
            problems.append(f"no change scores {self.none_reward}, expected 0")
        return "; ".join(problems)


async def _reward(factory: SandboxFactory, task: Task, *, gold: bool, timeout: float) -> float:
    box = create_sandbox(factory, task.workspace, task.environment.docker_image or None)
    await box.start()
    try:
        if gold:
            remote = f"{await workspace_root(box)}/{SOLVE_NAME}"
            await box.upload(task.solution_script, remote)
            solved = await box.exec(
                f"bash {remote}; status=$?; rm -f {remote}; exit $status", timeout=SOLVE_TIMEOUT_S
            )
            if not solved.ok:
                raise SandboxError(
                    f"solve.sh failed (exit {solved.exit_code}): {solved.stderr.strip()[-500:]}"
                )
        verdict = await run_verifier(box, task, timeout)
        return verdict.reward
    finally:
        await box.stop()


async def check_task(factory: SandboxFactory, task: Task, timeout: float | None = None) -> CheckResult:
    began = time.monotonic()
    limit = task.verifier_timeout_s if timeout is None else timeout
    if task.workspace is None and factory.backend != "docker":
        return CheckResult(
            task.id, None, None, f"needs the docker backend (image {task.environment.docker_image})"
        )
    if not task.solution_script.is_file():
        return CheckResult(task.id, None, None, "no solution/solve.sh")
    try:
        gold = await _reward(factory, task, gold=True, timeout=limit)
        none = await _reward(factory, task, gold=False, timeout=limit)
    except SandboxError as error:
        return CheckResult(task.id, None, None, f"{error.kind}: {error}", time.monotonic() - began)
    return CheckResult(task.id, gold, none, "", time.monotonic() - began)


async def check_tasks(
    factory: SandboxFactory,
    tasks: Sequence[Task],
    concurrency: int,
    on_result: Callable[[CheckResult], None] | None = None,
) -> list[CheckResult]:
    """Check every task, `concurrency` at a time; results in the order of `tasks`."""
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task) -> CheckResult:
        async with gate:
            result = await check_task(factory, task)
        if on_result is not None:
            on_result(result)
        return result

    return list(await asyncio.gather(*(one(task) for task in tasks)))
