"""Harbor task format: read, validate and write one task directory.

Layout (Harbor / Terminal-Bench):

    <task>/task.toml            version, [metadata] (incl. fail_to_pass / pass_to_pass),
                                [verifier] timeout_sec, [agent] timeout_sec, [environment]
    <task>/instruction.md       what the agent is asked to do
    <task>/environment/         for bwrap: `repo/` (the workspace snapshot); a Dockerfile for docker
    <task>/tests/test.sh        the verifier; writes $LOGS_DIR/reward.txt (default /logs/verifier)
    <task>/solution/solve.sh    the gold solution (optional in Harbor, required by `tasks check`)

`load_task` raises `TaskFormatError` naming the file, the key and what to do.
Tasks that run from a Docker image (SWE-bench imports) set `environment.docker_image`
and may have no `environment/repo/`; their `workspace` is None.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TASK_FILE = "task.toml"
INSTRUCTION_FILE = "instruction.md"
TEST_SCRIPT = "tests/test.sh"
SOLUTION_SCRIPT = "solution/solve.sh"
REPO_DIR = "environment/repo"
FORMAT_VERSION = "1.0"


class TaskFormatError(ValueError):
    """A task directory that does not follow the Harbor format; the message says where and what to do."""


@dataclass(frozen=True)
class TaskMetadata:
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...] = ()
    source: str = ""
    difficulty: str = "medium"
    category: str = "debugging"
    tags: tuple[str, ...] = ()
    author_name: str = "rollstream"
    mutation: str = ""  # e.g. "flip_comparison in isodate/duration.py:Duration.__add__"


@dataclass(frozen=True)
class EnvironmentSpec:
    docker_image: str = ""
    build_timeout_sec: float = 600.0
    cpus: int = 1
    memory_mb: int = 2048
    storage_mb: int = 10240


@dataclass(frozen=True)
class Task:
    id: str
    dir: Path
    instruction: str
    workspace: Path | None
    metadata: TaskMetadata
    verifier_timeout_s: float = 300.0
    agent_timeout_s: float = 1800.0
    verifier_env: dict[str, str] = field(default_factory=dict)
    environment: EnvironmentSpec = EnvironmentSpec()

    @property
    def tests_dir(self) -> Path:
        return self.dir / "tests"

    @property
    def solution_script(self) -> Path:
        return self.dir / SOLUTION_SCRIPT


def load_task(task_dir: Path) -> Task:
    """Read and validate one Harbor task directory."""
    task_dir = Path(task_dir)
    if not task_dir.is_dir():
        raise TaskFormatError(f"{task_dir}: not a directory; pass a Harbor task directory")
    config_path = task_dir / TASK_FILE
    if not config_path.is_file():
        raise TaskFormatError(f"{config_path}: missing; every Harbor task needs a task.toml")
    try:
        tree = tomllib.loads(config_path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise TaskFormatError(f"{config_path}: not valid TOML ({error}); fix the syntax") from None
    instruction_path = task_dir / INSTRUCTION_FILE
    if not instruction_path.is_file() or not instruction_path.read_text().strip():
        raise TaskFormatError(f"{instruction_path}: missing or empty; write the task for the agent there")
    test_script = task_dir / TEST_SCRIPT
    if not test_script.is_file():
        raise TaskFormatError(f"{test_script}: missing; the verifier runs tests/test.sh")
    environment = _environment(config_path, _table(config_path, tree, "environment"))
    repo = task_dir / REPO_DIR
    if not repo.is_dir() and not environment.docker_image:
        raise TaskFormatError(
            f"{task_dir}: neither {REPO_DIR}/ nor [environment] docker_image; "
            "put the repository snapshot in environment/repo/ or name a Docker image"
        )
    return Task(
        id=task_dir.name,
        dir=task_dir,
        instruction=instruction_path.read_text(),
        workspace=repo if repo.is_dir() else None,
        metadata=_metadata(config_path, _table(config_path, tree, "metadata")),
        verifier_timeout_s=_number(config_path, _table(config_path, tree, "verifier"), "verifier", 300.0),
        agent_timeout_s=_number(config_path, _table(config_path, tree, "agent"), "agent", 1800.0),
        verifier_env=_env(config_path, _table(config_path, tree, "verifier")),
        environment=environment,
    )


def load_tasks(root: Path) -> list[Task]:
    """Every task directory (one holding task.toml) directly under `root`, sorted by id."""
    root = Path(root)
    if not root.is_dir():
        raise TaskFormatError(f"{root}: not a directory; build tasks first (rollstream tasks default)")
    tasks = [load_task(d) for d in sorted(root.iterdir()) if (d / TASK_FILE).is_file()]
    if not tasks:
        raise TaskFormatError(f"{root}: no task directories (none holds a task.toml)")
    return tasks


def _table(path: Path, tree: dict[str, Any], name: str) -> dict[str, Any]:
    value = tree.get(name, {})
    if not isinstance(value, dict):
        raise TaskFormatError(f"{path}: [{name}] must be a table, got {type(value).__name__}")
    return value


def _string_list(path: Path, table: dict[str, Any], key: str, required: bool) -> tuple[str, ...]:
    if key not in table:
        if required:
            raise TaskFormatError(
                f"{path}: [metadata] {key} is missing; list the test ids (pytest node ids) there"
            )
        return ()
    value = table[key]
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise TaskFormatError(f"{path}: [metadata] {key} must be a list of non-empty strings")
    return tuple(value)


def _metadata(path: Path, table: dict[str, Any]) -> TaskMetadata:
    fail_to_pass = _string_list(path, table, "fail_to_pass", required=True)
    if not fail_to_pass:
        raise TaskFormatError(f"{path}: [metadata] fail_to_pass is empty; a task needs at least one test")
    text = {
        key: table.get(key, default)
        for key, default in (
            ("source", ""),
            ("difficulty", "medium"),
            ("category", "debugging"),
            ("author_name", "rollstream"),
            ("mutation", ""),
        )
    }
    for key, value in text.items():
        if not isinstance(value, str):
            raise TaskFormatError(f"{path}: [metadata] {key} must be a string")
    return TaskMetadata(
        fail_to_pass=fail_to_pass,
        pass_to_pass=_string_list(path, table, "pass_to_pass", required=False),
        tags=_string_list(path, table, "tags", required=False),
        **text,
    )


def _number(path: Path, table: dict[str, Any], section: str, default: float) -> float:
    value = table.get("timeout_sec", default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise TaskFormatError(f"{path}: [{section}] timeout_sec must be a positive number of seconds")
    return float(value)


def _env(path: Path, table: dict[str, Any]) -> dict[str, str]:
    value = table.get("env", {})
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise TaskFormatError(f"{path}: [verifier] env must be a table of strings")
    return dict(value)


def _environment(path: Path, table: dict[str, Any]) -> EnvironmentSpec:
    image = table.get("docker_image", "")
    if not isinstance(image, str):
        raise TaskFormatError(f"{path}: [environment] docker_image must be a string")
    numbers: dict[str, Any] = {}
    for key, default in (
        ("build_timeout_sec", 600.0),
        ("cpus", 1),
        ("memory_mb", 2048),
        ("storage_mb", 10240),
    ):
        value = table.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            raise TaskFormatError(f"{path}: [environment] {key} must be a positive number")
        numbers[key] = type(default)(value)
    return EnvironmentSpec(docker_image=image, **numbers)


# ---------------------------------------------------------------- writing


def task_toml(task: Task) -> str:
    """The task.toml text for `task` (keys in Harbor's order, ours in [metadata])."""
    meta = task.metadata
    env = task.environment
    sections: list[tuple[str, dict[str, Any]]] = [
        (
            "metadata",
            {
                "author_name": meta.author_name,
                "difficulty": meta.difficulty,
                "category": meta.category,
                "tags": list(meta.tags),
                "source": meta.source,
                "mutation": meta.mutation,
                "fail_to_pass": list(meta.fail_to_pass),
                "pass_to_pass": list(meta.pass_to_pass),
            },
        ),
        ("verifier", {"timeout_sec": task.verifier_timeout_s, "env": task.verifier_env}),
        ("agent", {"timeout_sec": task.agent_timeout_s}),
        (
            "environment",
            {
                "docker_image": env.docker_image,
                "build_timeout_sec": env.build_timeout_sec,
                "cpus": env.cpus,
                "memory_mb": env.memory_mb,
                "storage_mb": env.storage_mb,
            },
        ),
    ]
    out = [f"version = {_toml_value(FORMAT_VERSION)}"]
    for name, values in sections:
        out.append(f"\n[{name}]")
        out.extend(f"{key} = {_toml_value(value)}" for key, value in values.items())
    return "\n".join(out) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)  # JSON strings are valid TOML basic strings
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        return "[\n" + "".join(f"    {_toml_value(v)},\n" for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def write_task_files(
    task_dir: Path, task: Task, *, test_sh: str, solve_sh: str, dockerfile: str | None = None
) -> None:
    """Write everything except environment/repo/ (the caller puts the snapshot there)."""
    task_dir.mkdir(parents=True, exist_ok=True)
    (task_dir / TASK_FILE).write_text(task_toml(task))
    (task_dir / INSTRUCTION_FILE).write_text(task.instruction)
    for relative, text in ((TEST_SCRIPT, test_sh), (SOLUTION_SCRIPT, solve_sh)):
        path = task_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755)
    if dockerfile is not None:
        (task_dir / "environment").mkdir(parents=True, exist_ok=True)
        (task_dir / "environment" / "Dockerfile").write_text(dockerfile)
