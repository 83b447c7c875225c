"""Harbor format: a written task loads back unchanged; each malformed part is a clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandboxes.tasks.harbor import (
    EnvironmentSpec,
    Task,
    TaskFormatError,
    TaskMetadata,
    load_task,
    load_tasks,
    task_toml,
    write_task_files,
)


def make_task(root: Path, name: str = "demo-task", *, with_repo: bool = True) -> Path:
    task_dir = root / name
    task = Task(
        id=name,
        dir=task_dir,
        instruction="Fix the bug in `add`.\n",
        workspace=None,
        metadata=TaskMetadata(
            fail_to_pass=("tests/test_m.py::test_add",),
            pass_to_pass=('tests/test_m.py::test_sub[a "quoted" id]',),
            source="sdist:demo==1.0",
            tags=("demo",),
            mutation="flip_comparison in m.py:add (line 2)",
        ),
        verifier_timeout_s=42.0,
        agent_timeout_s=99.0,
        verifier_env={"A": "1"},
    )
    write_task_files(
        task_dir, task, test_sh="#!/bin/sh\necho 1 > $LOGS_DIR/reward.txt\n", solve_sh="#!/bin/sh\n"
    )
    if with_repo:
        (task_dir / "environment" / "repo").mkdir(parents=True)
    return task_dir


def test_written_task_loads_back(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path))
    assert task.id == "demo-task"
    assert task.metadata.fail_to_pass == ("tests/test_m.py::test_add",)
    assert task.metadata.pass_to_pass == ('tests/test_m.py::test_sub[a "quoted" id]',)
    assert task.metadata.source == "sdist:demo==1.0"
    assert task.verifier_timeout_s == 42.0 and task.agent_timeout_s == 99.0
    assert task.verifier_env == {"A": "1"}
    assert task.workspace == tmp_path / "demo-task" / "environment" / "repo"
    assert task.instruction.startswith("Fix the bug")
    assert (task.dir / "tests" / "test.sh").stat().st_mode & 0o111


def test_load_tasks_sorted_and_empty_dir_is_an_error(tmp_path: Path) -> None:
    make_task(tmp_path, "b")
    make_task(tmp_path, "a")
    assert [t.id for t in load_tasks(tmp_path)] == ["a", "b"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TaskFormatError, match="no task directories"):
        load_tasks(empty)


def _rewrite(task_dir: Path, old: str, new: str) -> None:
    path = task_dir / "task.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: (d / "task.toml").unlink(), r"task.toml: missing"),
        (lambda d: (d / "task.toml").write_text("version = [\n"), r"not valid TOML"),
        (lambda d: (d / "instruction.md").write_text("  \n"), r"instruction.md: missing or empty"),
        (lambda d: (d / "tests" / "test.sh").unlink(), r"tests/test.sh: missing"),
        (lambda d: _rewrite(d, "fail_to_pass = [", "failing = ["), r"\[metadata\] fail_to_pass is missing"),
        (
            lambda d: _rewrite(d, '    "tests/test_m.py::test_add",\n', ""),
            r"\[metadata\] fail_to_pass is empty",
        ),
        (lambda d: _rewrite(d, "timeout_sec = 42.0", 'timeout_sec = "soon"'), r"\[verifier\] timeout_sec"),
        (lambda d: _rewrite(d, "cpus = 1", "cpus = 0"), r"\[environment\] cpus must be a positive"),
        (lambda d: _rewrite(d, 'source = "sdist:demo==1.0"', "source = 3"), r"\[metadata\] source must be"),
        (
            lambda d: (d / "environment" / "repo").rmdir(),
            r"neither environment/repo/ nor \[environment\] docker_image",
        ),
    ],
)
def test_malformed_task_names_file_and_key(tmp_path: Path, change, message: str) -> None:
    task_dir = make_task(tmp_path)
    change(task_dir)
    with pytest.raises(TaskFormatError, match=message) as caught:
        load_task(task_dir)
    assert str(task_dir) in str(caught.value)


def test_docker_image_task_needs_no_repo(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path, with_repo=False)
    _rewrite(task_dir, 'docker_image = ""', 'docker_image = "swebench/x:latest"')
    task = load_task(task_dir)
    assert task.workspace is None
    assert task.environment == EnvironmentSpec(docker_image="swebench/x:latest")


def test_task_toml_is_harbor_shaped(tmp_path: Path) -> None:
    text = task_toml(load_task(make_task(tmp_path)))
    for section in ("[metadata]", "[verifier]", "[agent]", "[environment]"):
        assert section in text
    assert text.startswith('version = "1.0"')
