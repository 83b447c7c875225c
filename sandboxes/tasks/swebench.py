"""Import SWE-bench / SWE-smith instances as Harbor tasks that run in their Docker images.

Input: a JSON list, one JSON object, or JSON lines, each with `instance_id`, `repo`,
`base_commit`, `patch`, `test_patch`, `FAIL_TO_PASS`, `PASS_TO_PASS` (lists, or JSON
strings of lists as in the Hugging Face datasets), `problem_statement`, and for SWE-smith
`image_name`. SWE-bench's image is `swebench/sweb.eval.x86_64.<id with __ → _1776_>`.

The task has no `environment/repo/`: the repository is at `/testbed` in the image
(`[environment] docker_image`), so it needs the docker backend. test.sh restores the
test files at `base_commit`, applies `test_patch`, runs FAIL_TO_PASS + PASS_TO_PASS with
pytest and grades them with the same grade.py as sdist tasks. Repositories whose tests
do not run under pytest (Django's runtests.py, SymPy's bin/test) are not supported yet.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

from sandboxes.settings import TaskSettings
from sandboxes.tasks.harbor import EnvironmentSpec, Task, TaskMetadata, write_task_files
from sandboxes.tasks.runtime import write_grader

REQUIRED = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "problem_statement")
SWEBENCH_IMAGE = "swebench/sweb.eval.x86_64.{key}:latest"
REPO_PATH = "/testbed"

_TEST_SH = """#!/usr/bin/env bash
# Verifier for SWE-bench instance {instance_id}: restore the tests, apply the test patch,
# run FAIL_TO_PASS + PASS_TO_PASS with pytest, grade. Exits 2 without a reward on setup errors.
set -u
TESTS_DIR="${{TESTS_DIR:-/tests}}"
LOGS_DIR="${{LOGS_DIR:-/logs/verifier}}"
mkdir -p "$LOGS_DIR"
cd {repo_path} || exit 2
if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate testbed; fi
git checkout -q {base_commit} -- {test_files} 2>/dev/null
git apply --whitespace=nowarn "$TESTS_DIR/test.patch" || {{ echo "cannot apply test.patch" >&2; exit 2; }}
python -m pytest -p no:cacheprovider -rA --tb=no {test_ids} > "$LOGS_DIR/pytest.log" 2>&1
python "$TESTS_DIR/grade.py" "$TESTS_DIR/tests.json" "$LOGS_DIR/pytest.log" "$LOGS_DIR" || exit 2
"""

_SOLVE_SH = """#!/usr/bin/env bash
# Gold solution: the instance's reference patch.
set -euo pipefail
cd {repo_path}
git apply --whitespace=nowarn <<'ROLLSTREAM_GOLD_PATCH'
{patch}ROLLSTREAM_GOLD_PATCH
"""


class SwebenchImportError(ValueError):
    """An input file or instance that cannot be imported; the message says which and why."""


def read_instances(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as error:
        raise SwebenchImportError(f"{path}: cannot read ({error})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        try:
            data = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as error:
            raise SwebenchImportError(f"{path}: neither JSON nor JSON lines ({error})") from None
    items = data if isinstance(data, list) else [data]
    if not all(isinstance(item, dict) for item in items):
        raise SwebenchImportError(f"{path}: expected objects (SWE-bench instances)")
    return items


def _test_list(instance: dict[str, Any], key: str) -> tuple[str, ...]:
    value = instance.get(key, [])
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise SwebenchImportError(f"{instance.get('instance_id')}: {key} is not a JSON list") from None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SwebenchImportError(f"{instance.get('instance_id')}: {key} must be a list of test ids")
    return tuple(value)


def image_for(instance: dict[str, Any]) -> str:
    if instance.get("image_name"):
        return str(instance["image_name"])
    return SWEBENCH_IMAGE.format(key=str(instance["instance_id"]).replace("__", "_1776_").lower())


def patched_files(patch: str) -> list[str]:
    return sorted(set(re.findall(r"^diff --git a/(\S+) b/", patch, flags=re.MULTILINE)))


def task_id_for(instance_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", instance_id).strip("-")


def write_swebench_task(instance: dict[str, Any], out: Path, settings: TaskSettings) -> str:
    missing = [key for key in REQUIRED if key not in instance]
    if missing:
        raise SwebenchImportError(f"{instance.get('instance_id', '?')}: missing {', '.join(missing)}")
    fail_to_pass = _test_list(instance, "FAIL_TO_PASS")
    pass_to_pass = _test_list(instance, "PASS_TO_PASS")
    if not fail_to_pass:
        raise SwebenchImportError(f"{instance['instance_id']}: FAIL_TO_PASS is empty")
    task_id = task_id_for(str(instance["instance_id"]))
    task_dir = out / task_id
    image = image_for(instance)
    task = Task(
        id=task_id,
        dir=task_dir,
        instruction=str(instance["problem_statement"]).strip() + "\n",
        workspace=None,
        metadata=TaskMetadata(
            fail_to_pass=fail_to_pass,
            pass_to_pass=pass_to_pass,
            source=f"swebench:{instance['instance_id']}",
            tags=(str(instance["repo"]),),
        ),
        verifier_timeout_s=settings.verifier_timeout_s,
        agent_timeout_s=settings.agent_timeout_s,
        environment=EnvironmentSpec(docker_image=image),
    )
    test_files = patched_files(str(instance["test_patch"]))
    test_sh = _TEST_SH.format(
        instance_id=instance["instance_id"],
        repo_path=REPO_PATH,
        base_commit=shlex.quote(str(instance["base_commit"])),
        test_files=" ".join(shlex.quote(f) for f in test_files) or ".",
        test_ids=" ".join(shlex.quote(t) for t in (*fail_to_pass, *pass_to_pass)),
    )
    patch = str(instance["patch"])
    solve_sh = _SOLVE_SH.format(repo_path=REPO_PATH, patch=patch if patch.endswith("\n") else patch + "\n")
    write_task_files(task_dir, task, test_sh=test_sh, solve_sh=solve_sh, dockerfile=f"FROM {image}\n")
    tests = task_dir / "tests"
    (tests / "test.patch").write_text(str(instance["test_patch"]))
    write_grader(tests, fail_to_pass, pass_to_pass)
    return task_id


def import_swebench(path: Path, out: Path, settings: TaskSettings) -> list[str]:
    """Write one task per instance in `path` under `out`; returns the task ids."""
    instances = read_instances(path)
    if not instances:
        raise SwebenchImportError(f"{path}: no instances")
    out.mkdir(parents=True, exist_ok=True)
    return [write_swebench_task(instance, out, settings) for instance in instances]
