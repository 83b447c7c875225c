"""Deterministic identities: the same (run, task, group index) always names the same group,
and the same (group, attempt, retry) the same trajectory, so a re-submitted or re-run
request writes events with the same ids (consumers deduplicate by id)."""

from __future__ import annotations

import uuid

IDENTITY_NAMESPACE = uuid.UUID("0c6f7a52-3b8e-4d51-9f0e-7e4b1a2c9d33")


def group_id(run_id: str, task_id: str, group_index: int) -> str:
    """The GRPO group of `task_id`'s `group_index`-th group in `run_id`."""
    if group_index < 0:
        raise ValueError(f"group_index must be >= 0, got {group_index}")
    return str(uuid.uuid5(IDENTITY_NAMESPACE, f"group|{run_id}|{task_id}|{group_index}"))


def trajectory_id(group: str, attempt: int, retry: int) -> str:
    """Attempt `attempt` of `group`, re-run `retry` times after infrastructure errors."""
    if attempt < 0 or retry < 0:
        raise ValueError(f"attempt and retry must be >= 0, got {attempt}, {retry}")
    return str(uuid.uuid5(IDENTITY_NAMESPACE, f"trajectory|{group}|{attempt}|{retry}"))


def request_id(trajectory: str, turn: int) -> str:
    """The engine request id (`rid`) of one turn: abortable by name, unique per turn."""
    return f"{trajectory}:{turn}"


def sampling_seed(trajectory: str, turn: int) -> int:
    """A per-turn seed, so a re-run of an episode on the same weights samples the same tokens."""
    return uuid.uuid5(IDENTITY_NAMESPACE, f"seed|{trajectory}|{turn}").int % (2**31 - 1)
