"""Evaluation: pass@1 of a policy on a task set, through real episodes whose events go to the log.

`evaluate(...)` runs `attempts` episodes of every task (one group per task, under the
eval's own run id) with the worker's episode code, writing every event to
`rollout.events` like a rollout worker does, so SQL answers "pass@1 by version" for
eval runs as for any other. An attempt that ends in an infrastructure error is re-run
(a new trajectory id, `retry + 1`) up to `max_infra_reruns` times and is never counted
as a failure; an attempt still failing then raises `EvalInfraError` rather than bias
the figure.

pass@1 is the reference run's: for each task the mean success over its attempts, then
the mean over tasks (`pass_at_1`, pure).
"""

from __future__ import annotations

import asyncio
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agents.episode import EpisodeServices, EpisodeSpec, EventSink
from agents.identity import group_id, trajectory_id
from agents.scaffolds import new_episode
from sandboxes.tasks import Task
from streams.outcomes import Outcome
from streams.payloads import Limits


class EvalInfraError(RuntimeError):
    """An attempt ended in an infrastructure error every time it was run; the message says which."""


@dataclass(frozen=True)
class AttemptResult:
    task_id: str
    attempt: int
    resolved: bool
    outcome: str
    reruns: int  # infrastructure errors re-run before this result


@dataclass(frozen=True)
class EvalResult:
    run_id: str
    model_version: int
    tasks: int
    attempts: int
    pass1: float
    infra_reruns: int
    outcomes: dict[str, int]
    task_means: dict[str, float] = field(default_factory=dict)  # per task: the mean success of its attempts

    @property
    def pass1_stderr(self) -> float:
        """Standard error of pass@1 over tasks (the tasks are the sample: sd of task means / sqrt(n))."""
        return stderr_of(list(self.task_means.values()))

    def summary(self) -> dict[str, object]:
        """The last line of `rollstream eval`."""
        return {
            "pass1": round(self.pass1, 4),
            "pass1_stderr": round(self.pass1_stderr, 4),
            "tasks": self.tasks,
            "attempts": self.attempts,
            "model_version": self.model_version,
            "run_id": self.run_id,
            "infra_reruns": self.infra_reruns,
        }


def task_means(results: Sequence[AttemptResult]) -> dict[str, float]:
    """Per task, the mean success over its attempts."""
    by_task: dict[str, list[bool]] = defaultdict(list)
    for result in results:
        by_task[result.task_id].append(result.resolved)
    return {task: sum(v) / len(v) for task, v in by_task.items()}


def pass_at_1(results: Sequence[AttemptResult]) -> float:
    """Mean over tasks of the mean per-attempt success (0.0 for no results)."""
    means = task_means(results)
    return sum(means.values()) / len(means) if means else 0.0


def stderr_of(values: Sequence[float]) -> float:
    """Standard error of the mean of `values` (sample sd / sqrt(n); 0 for fewer than 2)."""
    if len(values) < 2:
        return 0.0
    return statistics.stdev(values) / math.sqrt(len(values))


def paired_gain(before: EvalResult, after: EvalResult) -> tuple[float, float]:
    """(mean gain, its standard error) of `after` over `before` on the tasks both measured, paired by
    task: the held-out tasks are shared, so their difficulty cancels out of the gain's error."""
    shared = sorted(set(before.task_means) & set(after.task_means))
    gains = [after.task_means[t] - before.task_means[t] for t in shared]
    return (sum(gains) / len(gains) if gains else 0.0), stderr_of(gains)


async def evaluate(
    run_id: str,
    tasks: Sequence[Task],
    attempts: int,
    *,
    services: EpisodeServices,
    sink: EventSink,
    limits: Limits,
    concurrency: int,
    max_infra_reruns: int,
    model_version: int,
    on_result: Callable[[AttemptResult], None] | None = None,
) -> EvalResult:
    """Run every (task, attempt) and return pass@1 (see the module docstring)."""
    if attempts < 1 or not tasks:
        raise ValueError("an evaluation needs at least one task and one attempt")
    slots = asyncio.Semaphore(concurrency)

    async def one(task: Task, attempt: int) -> AttemptResult:
        group = group_id(run_id, task.id, 0)
        for retry in range(max_infra_reruns + 1):
            spec = EpisodeSpec(
                run_id=run_id,
                group_id=group,
                trajectory_id=trajectory_id(group, attempt, retry),
                task=task,
                attempt=attempt,
                retry=retry,
                group_size=attempts,
                limits=limits,
            )
            async with slots:
                finished = await new_episode(spec, services, sink).run()
            if not finished.outcome.is_infra_error:
                result = AttemptResult(
                    task.id, attempt, finished.outcome == Outcome.RESOLVED, finished.outcome.value, retry
                )
                if on_result is not None:
                    on_result(result)
                return result
        raise EvalInfraError(
            f"task {task.id} attempt {attempt}: {max_infra_reruns + 1} runs all ended in "
            f"{finished.outcome.value} ({finished.error}); fix the infrastructure and evaluate again"
        )

    results = await asyncio.gather(*(one(task, a) for task in tasks for a in range(attempts)))
    return EvalResult(
        run_id=run_id,
        model_version=model_version,
        tasks=len(tasks),
        attempts=attempts,
        pass1=pass_at_1(results),
        task_means=task_means(results),
        infra_reruns=sum(r.reruns for r in results),
        outcomes=dict(Counter(r.outcome for r in results)),
    )
