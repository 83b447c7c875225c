"""Writes one Harbor task for a kept mutant of an sdist.

environment/repo/      the unpacked sdist with the bug injected (the agent's workspace)
environment/Dockerfile the same for Docker users (python:3.11-slim + pytest)
tests/test.sh          runs exactly FAIL_TO_PASS + PASS_TO_PASS; grade.py, tests.json,
                       pytest.pyz, and suite/ (the original test files, restored first)
solution/solve.sh      the gold patch (reverses the mutation) applied with `patch -p1`
instruction.md         issue-style text from the failing tests (never from the diff)
"""

from __future__ import annotations

import difflib
import shutil
from dataclasses import dataclass
from pathlib import Path

from sandboxes.settings import TaskSettings
from sandboxes.tasks.harbor import REPO_DIR, Task, TaskMetadata, write_task_files
from sandboxes.tasks.instruction import FailingTest, write_instruction
from sandboxes.tasks.mutants import Judgement
from sandboxes.tasks.mutators import Mutation
from sandboxes.tasks.runtime import verifier_script, write_runtime_files
from sandboxes.tasks.sdist import ProjectLayout, SdistSpec

IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".rollstream-build", ".pytest_cache")
PATCH_MARKER = "ROLLSTREAM_GOLD_PATCH"
REDACT_MIN_CHARS = 8
DOCKERFILE = """FROM python:3.11-slim
RUN pip install --no-cache-dir "pytest>=8"
COPY repo /workspace
WORKDIR /workspace
"""


@dataclass(frozen=True)
class KeptMutant:
    mutation: Mutation
    mutated: str  # the whole mutated file
    judgement: Judgement


def gold_patch(path: str, original: str, mutated: str) -> str:
    """A `patch -p1` diff that turns the mutant back into the original."""
    diff = difflib.unified_diff(
        mutated.splitlines(keepends=True),
        original.splitlines(keepends=True),
        fromfile=f"a/{path}",
        tofile=f"b/{path}",
    )
    return "".join(
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff
    )


def solve_sh(patch: str) -> str:
    return (
        "#!/usr/bin/env bash\n"
        "# Gold solution: reverses the injected bug.\n"
        "set -euo pipefail\n"
        'cd "${REPO_DIR:-$PWD}"\n'
        f"patch -p1 --forward --no-backup-if-mismatch <<'{PATCH_MARKER}'\n"
        f"{patch}{PATCH_MARKER}\n"
    )


def changed_lines(original: str, mutated: str) -> list[str]:
    before = {line.strip() for line in original.splitlines()}
    return [
        s for line in mutated.splitlines() if (s := line.strip()) not in before and len(s) >= REDACT_MIN_CHARS
    ]


def copy_test_suite(layout: ProjectLayout, suite: Path) -> None:
    """The original test files, which test.sh copies back over the workspace before grading."""
    for relative in layout.test_support:
        source, dest = layout.root / relative, suite / relative
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, dest, ignore=IGNORED, symlinks=True)
        else:
            shutil.copy2(source, dest)


def write_sdist_task(
    task_dir: Path,
    item: KeptMutant,
    layout: ProjectLayout,
    pyz: Path,
    spec: SdistSpec,
    settings: TaskSettings,
) -> Task:
    """Write the whole task directory (replacing an old one) and return the task."""
    if task_dir.exists():
        shutil.rmtree(task_dir)
    mutation, verdict = item.mutation, item.judgement
    original = (layout.root / mutation.path).read_text()
    repo = task_dir / REPO_DIR
    shutil.copytree(layout.root, repo, ignore=IGNORED, symlinks=True)
    (repo / mutation.path).write_text(item.mutated)
    copy_test_suite(layout, task_dir / "tests" / "suite")
    write_runtime_files(task_dir / "tests", pyz, list(verdict.fail_to_pass), list(verdict.pass_to_pass))
    pythonpath = ":".join(root for root in layout.source_roots if root != ".")
    instruction = write_instruction(
        spec.name,
        [FailingTest(t, verdict.messages.get(t, "")) for t in verdict.fail_to_pass],
        pythonpath=pythonpath,
        redact=changed_lines(original, item.mutated),
        variant_key=task_dir.name,
    )
    task = Task(
        id=task_dir.name,
        dir=task_dir,
        instruction=instruction,
        workspace=repo,
        metadata=TaskMetadata(
            fail_to_pass=verdict.fail_to_pass,
            pass_to_pass=verdict.pass_to_pass,
            source=f"sdist:{spec}",
            tags=(spec.name, mutation.kind),
            mutation=f"{mutation.kind} in {mutation.path}:{mutation.function} (line {mutation.line})",
        ),
        verifier_timeout_s=settings.verifier_timeout_s,
        agent_timeout_s=settings.agent_timeout_s,
    )
    write_task_files(
        task_dir,
        task,
        test_sh=verifier_script(
            [*verdict.fail_to_pass, *verdict.pass_to_pass],
            list(layout.source_roots),
            settings.python,
            restore=layout.test_support,
        ),
        solve_sh=solve_sh(gold_patch(mutation.path, original, item.mutated)),
        dockerfile=DOCKERFILE,
    )
    return task
