"""What a rollout worker (agents/rollout.py) is built from besides its loop: its settings
(`WorkerSettings`), its name on the events it writes (`worker_name`), and the catalog its
requests name tasks from (`TaskCatalog`, each task loaded once).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from agents.settings import RolloutSettings
from sandboxes.tasks import Task, TaskFormatError, load_task
from streams.settings import KafkaSettings, PolicySettings, TopicSettings


def worker_name() -> str:
    return f"rollout-{socket.gethostname()}-{os.getpid()}"


class TaskCatalog:
    """Tasks by directory name under one root, each loaded once."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()
        self._tasks: dict[str, Task] = {}

    def get(self, task_dir: str) -> Task:
        task = self._tasks.get(task_dir)
        if task is None:
            path = (self.root / task_dir).resolve()
            if path.parent != self.root:
                raise TaskFormatError(f"task_dir {task_dir!r} is not a directory directly under {self.root}")
            task = self._tasks[task_dir] = load_task(path)
        return task


@dataclass(frozen=True)
class WorkerSettings:
    kafka: KafkaSettings
    topics: TopicSettings
    rollout: RolloutSettings
    policy: PolicySettings
