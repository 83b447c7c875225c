"""Datasets rebuilt from a run: SFT, RL and trajectories, written as .jsonl or .parquet.

- `sft_rows`: one row per resolved trajectory: `messages` (chat turns: the prompt
  as `user`, each model output as `assistant`, each observation as `tool`) and the
  token view the trainer uses (`input_ids`, `loss_mask`). Message text comes from
  `decode` (a tokenizer's decode) when given; without one, assistant turns show
  the command the agent ran and tool turns the output it was shown.
- `rl_rows`: one row per group: members with their token arrays, rewards and
  advantages, or the drop reason.
- `trajectory_rows`: one row per assembled trajectory record.

`write_rows(rows, path)` picks the format from the suffix; both load with
`datasets.load_dataset("json" | "parquet", data_files=path)`.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from streams.assemble import Trajectory
from streams.events import Event
from streams.outcomes import Outcome
from streams.payloads import GroupFormed, TrajectoryAssembled

Decode = Callable[[list[int]], str]
FORMATS = (".jsonl", ".parquet")


class DatasetError(ValueError):
    """A dataset that cannot be written as asked; the message says what to change."""


def sft_rows(trajectories: Sequence[Trajectory], decode: Decode | None = None) -> list[dict[str, Any]]:
    rows = []
    for trajectory in sorted(trajectories, key=lambda t: t.trajectory_id):
        if trajectory.outcome != Outcome.RESOLVED:
            continue
        rows.append(
            {
                "run_id": trajectory.run_id,
                "task_id": trajectory.task_id,
                "trajectory_id": trajectory.trajectory_id,
                "messages": messages_of(trajectory, decode),
                "input_ids": list(trajectory.token_ids),
                "loss_mask": list(trajectory.loss_mask),
                "reward": trajectory.reward,
                "turns": trajectory.turns,
            }
        )
    return rows


def messages_of(trajectory: Trajectory, decode: Decode | None) -> list[dict[str, str]]:
    """The episode as chat messages (see module docstring for the text without a tokenizer)."""
    ids = list(trajectory.token_ids)
    prompt = ids[: trajectory.prompt_tokens]
    messages = [{"role": "user", "content": decode(prompt) if decode else f"<{len(prompt)} prompt tokens>"}]
    previous_output: str | None = None
    for record in trajectory.turn_records:
        # a gateway session's prompt is its first turn's observation: shown once, as the prompt
        observation = ids[max(record.observation_start, trajectory.prompt_tokens) : record.output_start]
        if observation:
            text = decode(observation) if decode else (previous_output or "")
            messages.append({"role": "tool", "content": text})
        output = ids[record.output_start : record.output_end]
        text = decode(output) if decode else f"```bash\n{record.command or ''}\n```"
        messages.append({"role": "assistant", "content": text})
        previous_output = record.tool_output
    return messages


def rl_rows(trajectories: Sequence[Event], groups: Sequence[Event]) -> list[dict[str, Any]]:
    """One row per group record, members joined with their trajectory records."""
    by_id = {e.trajectory_id: e.data for e in trajectories if isinstance(e.data, TrajectoryAssembled)}
    rows = []
    for event in sorted(groups, key=lambda e: e.group_id or ""):
        group = event.data
        if not isinstance(group, GroupFormed):
            continue
        members = [by_id.get(member) for member in group.members]
        rows.append(
            {
                "run_id": event.run_id,
                "group_id": event.group_id,
                "task_id": event.task_id,
                "dropped": group.dropped,
                "trajectory_ids": group.members,
                "rewards": group.rewards,
                "advantages": group.advantages,
                "loss_masked": group.loss_masked or [False] * len(group.members),
                "input_ids": [list(m.token_ids) if m else [] for m in members],
                "loss_mask": [list(m.loss_mask) if m else [] for m in members],
                "rollout_logprobs": [list(m.rollout_logprobs) if m else [] for m in members],
                "token_versions": [list(m.token_versions) if m else [] for m in members],
                "infra_errors": group.infra_errors,
                "weight_version": event.policy_version,
            }
        )
    return rows


def trajectory_rows(trajectories: Sequence[Event]) -> list[dict[str, Any]]:
    rows = []
    for event in sorted(trajectories, key=lambda e: e.trajectory_id or ""):
        data = event.data
        if not isinstance(data, TrajectoryAssembled):
            continue
        fields = data.model_dump(mode="python")
        row = {k: v.tolist() if isinstance(v, array) else v for k, v in fields.items()}
        row["times"] = data.times.model_dump()
        row["policy"] = json.dumps(data.policy.model_dump(), sort_keys=True)
        row["outcome"] = str(data.outcome)
        rows.append(
            {
                "run_id": event.run_id,
                "group_id": event.group_id,
                "trajectory_id": event.trajectory_id,
                "task_id": event.task_id,
                **row,
            }
        )
    return rows


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    if path.suffix not in FORMATS:
        raise DatasetError(f"{path}: unknown format {path.suffix!r}; use one of {', '.join(FORMATS)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        with path.open("w") as out:
            for row in rows:
                out.write(json.dumps(row) + "\n")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
