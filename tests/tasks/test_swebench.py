"""SWE-bench / SWE-smith import: instances become loadable Harbor tasks on their Docker images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sandboxes.settings import TaskSettings
from sandboxes.tasks.harbor import load_task, load_tasks
from sandboxes.tasks.swebench import SwebenchImportError, import_swebench

PATCH = (
    "diff --git a/pkg/core.py b/pkg/core.py\n--- a/pkg/core.py\n+++ b/pkg/core.py\n"
    "@@ -1 +1 @@\n-x = 1\n+x = 2\n"
)
TEST_PATCH = (
    "diff --git a/tests/test_core.py b/tests/test_core.py\n--- a/tests/test_core.py\n"
    "+++ b/tests/test_core.py\n@@ -1 +1 @@\n-def test_x(): pass\n+def test_x(): assert 1\n"
)


def instance(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {
        "instance_id": "owner__repo-123",
        "repo": "owner/repo",
        "base_commit": "abc123",
        "patch": PATCH,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": json.dumps(["tests/test_core.py::test_x"]),  # as in the HF dataset: a JSON string
        "PASS_TO_PASS": ["tests/test_core.py::test_y"],
        "problem_statement": "x should be 2\n",
    }
    base.update(overrides)
    return base


def test_swebench_instance_becomes_a_docker_task(tmp_path: Path) -> None:
    source = tmp_path / "instances.json"
    source.write_text(json.dumps([instance()]))
    ids = import_swebench(source, tmp_path / "out", TaskSettings())
    assert ids == ["owner__repo-123"]
    task = load_task(tmp_path / "out" / "owner__repo-123")
    assert task.workspace is None
    assert task.environment.docker_image == "swebench/sweb.eval.x86_64.owner_1776_repo-123:latest"
    assert task.metadata.fail_to_pass == ("tests/test_core.py::test_x",)
    assert task.metadata.pass_to_pass == ("tests/test_core.py::test_y",)
    assert task.metadata.source == "swebench:owner__repo-123"
    assert task.instruction == "x should be 2\n"
    test_sh = (task.tests_dir / "test.sh").read_text()
    assert "git checkout -q abc123 -- tests/test_core.py" in test_sh
    assert "tests/test_core.py::test_x tests/test_core.py::test_y" in test_sh
    assert (task.tests_dir / "test.patch").read_text() == TEST_PATCH
    assert PATCH in task.solution_script.read_text()
    assert "pkg/core.py" not in (task.dir / "instruction.md").read_text()


def test_swesmith_jsonl_uses_its_image(tmp_path: Path) -> None:
    source = tmp_path / "smith.jsonl"
    rows = [instance(instance_id="a__b.1", image_name="jyangballin/swesmith.x86_64.a_1776_b.1"), instance()]
    source.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    import_swebench(source, tmp_path / "out", TaskSettings())
    tasks = {t.id: t for t in load_tasks(tmp_path / "out")}
    assert tasks["a__b.1"].environment.docker_image == "jyangballin/swesmith.x86_64.a_1776_b.1"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({k: v for k, v in instance().items() if k != "patch"}, "missing patch"),
        (instance(FAIL_TO_PASS="[]"), "FAIL_TO_PASS is empty"),
        (instance(FAIL_TO_PASS="not json"), "FAIL_TO_PASS is not a JSON list"),
    ],
)
def test_bad_instances_are_clear_errors(tmp_path: Path, row: dict[str, object], message: str) -> None:
    source = tmp_path / "bad.json"
    source.write_text(json.dumps(row))
    with pytest.raises(SwebenchImportError, match=message):
        import_swebench(source, tmp_path / "out", TaskSettings())


def test_unreadable_file_is_a_clear_error(tmp_path: Path) -> None:
    source = tmp_path / "bad.json"
    source.write_text("{not json")
    with pytest.raises(SwebenchImportError, match="neither JSON nor JSON lines"):
        import_swebench(source, tmp_path / "out", TaskSettings())
