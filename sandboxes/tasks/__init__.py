"""Harbor tasks: the format, the verifier, and task generation from PyPI sdists.

Public surface: `load_task(dir) -> Task`, `load_tasks(root)`, `run_verifier(box, task,
timeout) -> Verdict` (raises `VerifierError`), `TaskFormatError`.
"""

from sandboxes.base import VerifierError
from sandboxes.tasks.harbor import Task, TaskFormatError, TaskMetadata, load_task, load_tasks
from sandboxes.tasks.verifier import Verdict, run_verifier

__all__ = [
    "Task",
    "TaskFormatError",
    "TaskMetadata",
    "Verdict",
    "VerifierError",
    "load_task",
    "load_tasks",
    "run_verifier",
]
