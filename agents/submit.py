"""`rollout submit`: the requests of a run, `group_size` attempts per task.

Each request is a `rollout.requested` event on `rollout.requests` keyed by its
group id, with the deterministic group and trajectory ids of `agents.identity`
and an event id derived from the trajectory id, so submitting the same run
twice writes records with the same ids (consumers deduplicate by id). The
limits in force come from `PolicySettings` and travel with each request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from agents.identity import group_id, trajectory_id
from streams.bus import EventProducer
from streams.events import Event, make_event
from streams.payloads import Limits, RolloutRequested
from streams.settings import KafkaSettings, PolicySettings, TopicSettings


@dataclass(frozen=True)
class TaskRef:
    task_id: str
    task_dir: str  # directory name within the workers' task root


def limits_of(policy: PolicySettings) -> Limits:
    return Limits(
        max_turns=policy.max_turns,
        max_new_tokens_per_turn=policy.max_new_tokens_per_turn,
        max_trajectory_tokens=policy.max_trajectory_tokens,
        context_cap=policy.context_cap,
        tool_output_chars=policy.tool_output_chars,
    )


def request_event(
    *,
    run_id: str,
    group: str,
    task: TaskRef,
    attempt: int,
    retry: int,
    group_size: int,
    limits: Limits,
    source: str,
) -> Event:
    """The request for attempt `attempt` (re-run `retry`) of `group`."""
    trajectory = trajectory_id(group, attempt, retry)
    data = RolloutRequested(
        task_dir=task.task_dir, attempt=attempt, retry=retry, group_size=group_size, limits=limits
    )
    return make_event(
        data,
        run_id=run_id,
        seq=0,
        time_ns=time.time_ns(),
        source=source,
        group_id=group,
        trajectory_id=trajectory,
        task_id=task.task_id,
        id_key=f"request:{trajectory}",
    )


def run_requests(
    run_id: str,
    tasks: list[TaskRef],
    group_size: int,
    limits: Limits,
    *,
    groups_per_task: int = 1,
    first_group: int = 0,
    source: str = "submit",
) -> list[Event]:
    """Every request of a run: for each task and group index, `group_size` attempts."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    events = []
    for index in range(first_group, first_group + groups_per_task):
        for task in tasks:
            group = group_id(run_id, task.task_id, index)
            for attempt in range(group_size):
                events.append(
                    request_event(
                        run_id=run_id,
                        group=group,
                        task=task,
                        attempt=attempt,
                        retry=0,
                        group_size=group_size,
                        limits=limits,
                        source=source,
                    )
                )
    return events


def task_refs(tasks_root: Path) -> list[TaskRef]:
    """The tasks under `tasks_root` (directories with a `task.toml`); a task's id is its directory name."""
    if not tasks_root.is_dir():
        raise FileNotFoundError(f"{tasks_root} does not exist; build tasks with `rollstream tasks`")
    refs = [TaskRef(d.name, d.name) for d in sorted(tasks_root.iterdir()) if (d / "task.toml").is_file()]
    if not refs:
        raise FileNotFoundError(f"no tasks (directories with task.toml) under {tasks_root}")
    return refs


async def submit_requests(kafka: KafkaSettings, topics: TopicSettings, events: list[Event]) -> int:
    """Write `events` to `rollout.requests` and wait until all are acked."""
    async with EventProducer(kafka, topics) as producer:
        for event in events:
            await producer.send("rollout.requests", event)
        await producer.flush()
    return len(events)
