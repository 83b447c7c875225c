"""The `sandbox.lifecycle` derived topic: a trajectory's sandbox events, once, when it folds (pure).

The monitor needs the sandbox lifecycle (backend, start time, queue wait, failure
kind) but not the rest of `rollout.events`, which is ~40x the volume. The stream
worker feeds every event it accepted to `LifecycleBuffer.observe`; `release`
turns a `trajectories` output into `sandbox.lifecycle` outputs for that
trajectory's sandbox events (original envelopes and ids, in seq order). Because
the worker never emits a trajectory twice (its `emitted` set, read back on
start), the lifecycle copies are written once too, even when the worker re-reads
events after a restart. Buffers of groups that form or move away are dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streams.events import Event
from streams.processor import Emit, Output

TOPIC = "sandbox.lifecycle"


class LifecycleBuffer:
    """Sandbox events of open trajectories, by group and trajectory."""

    def __init__(self) -> None:
        self._events: dict[str, dict[str, dict[int, Event]]] = {}

    def observe(self, event: Event, open_groups: Mapping[str, Any]) -> None:
        """Keep `event` when it is a sandbox event of an unfolded trajectory of a group the
        processor holds open (`StreamProcessor.groups`: group id -> state with `done`)."""
        if not event.type.startswith("sandbox."):
            return
        group_id, trajectory_id = event.group_id or "", event.trajectory_id or ""
        state = open_groups.get(group_id)
        if state is not None and trajectory_id not in state.done:
            self._events.setdefault(group_id, {}).setdefault(trajectory_id, {}).setdefault(event.seq, event)

    def release(self, outputs: list[Output]) -> list[Output]:
        """`outputs` with each folded trajectory's sandbox events before it; formed groups are dropped."""
        out: list[Output] = []
        for output in outputs:
            if isinstance(output, Emit) and output.topic == "trajectories":
                group = self._events.get(output.event.group_id or "", {})
                events = group.pop(output.event.trajectory_id or "", {})
                out += [Emit(TOPIC, events[seq]) for seq in sorted(events)]
            elif isinstance(output, Emit) and output.topic == "groups":
                self._events.pop(output.event.group_id or "", None)
            out.append(output)
        return out

    def forget(self, group_ids: Iterable[str]) -> None:
        for group_id in group_ids:
            self._events.pop(group_id, None)

    def __len__(self) -> int:
        return sum(len(t) for g in self._events.values() for t in g.values())
