"""Task generation from a real PyPI sdist (cached download), and the default task set."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollstream.cli import app
from rollstream.config import Config
from rollstream.default_tasks import RECIPE_FILE, is_current
from sandboxes.backends import make_factory
from sandboxes.tasks.build import BuildRequest, build_from_sdist
from sandboxes.tasks.check import check_tasks
from sandboxes.tasks.harbor import load_tasks
from sandboxes.tasks.sdist import SdistSpec, UnfitLibraryError, analyze_project

pytestmark = pytest.mark.slow
LIBRARY = "tinydb==4.8.2"  # in the default set, so its sdist is already in the cache


def test_cli_builds_deterministic_tasks_from_an_sdist_and_they_check(
    tmp_path: Path, base_config: Config
) -> None:
    out = tmp_path / "built"
    runner = CliRunner()
    state = f'run.state_dir="{base_config.state_dir.resolve()}"'
    args = ["tasks", "build", "--from-sdist", LIBRARY, "--out", str(out), "--max", "2", "--seed", "3"]
    result = runner.invoke(app, [*args, "--set", state])
    assert result.exit_code == 0, result.output
    tasks = load_tasks(out)
    assert len(tasks) == 2
    for task in tasks:
        assert task.metadata.fail_to_pass and task.metadata.pass_to_pass
        assert not set(task.metadata.fail_to_pass) & set(task.metadata.pass_to_pass)
        assert task.metadata.source == f"sdist:{LIBRARY}"
        assert (task.dir / "environment" / "Dockerfile").is_file()
        patch = task.solution_script.read_text().splitlines()
        removed = [line[1:].strip() for line in patch if line.startswith("-") and not line.startswith("---")]
        assert all(line not in task.instruction for line in removed if len(line) > 8), (
            "instruction leaks the diff"
        )

    # the same seed gives the same tasks (built again through the API)
    request = BuildRequest(SdistSpec.parse(LIBRARY), tmp_path / "again", max_tasks=2, seed=3)
    factory = make_factory(base_config.sandbox)
    report = asyncio.run(
        build_from_sdist(request, base_config.tasks, factory, base_config.state_dir / "cache")
    )
    assert report.task_ids == [t.id for t in tasks]
    for task in tasks:
        again = tmp_path / "again" / task.id
        assert (again / "solution" / "solve.sh").read_text() == task.solution_script.read_text()
        assert (again / "task.toml").read_text() == (task.dir / "task.toml").read_text()

    listed = runner.invoke(app, ["tasks", "list", str(out), "--set", state])
    assert listed.exit_code == 0 and tasks[0].id[:12] in listed.output
    checked = runner.invoke(app, ["tasks", "check", str(out), "--set", state])
    assert checked.exit_code == 0, checked.output
    assert "2/2 valid" in checked.output


def test_unfit_libraries_say_why(tmp_path: Path) -> None:
    spec = SdistSpec.parse("demo==1.0")
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "__init__.py").write_text("x = 1\n")
    with pytest.raises(UnfitLibraryError, match="ships no tests"):
        analyze_project(tmp_path, spec)
    (tmp_path / "demo" / "speedups.c").write_text("int x;\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_demo.py").write_text("def test_x(): pass\n")
    with pytest.raises(UnfitLibraryError, match="compiled extension"):
        analyze_project(tmp_path, spec)
    with pytest.raises(ValueError, match="NAME==VERSION"):
        SdistSpec.parse("demo>=1.0")


def test_default_task_set_is_large_current_and_passes_check(
    default_tasks_dir: Path, base_config: Config
) -> None:
    tasks = load_tasks(default_tasks_dir)
    libraries = {task.metadata.source for task in tasks}
    assert len(tasks) >= 30 and len(libraries) >= 3
    assert (default_tasks_dir / RECIPE_FILE).is_file() and is_current(default_tasks_dir, base_config)
    results = asyncio.run(
        check_tasks(make_factory(base_config.sandbox), tasks, base_config.tasks.check_concurrency)
    )
    invalid = [(r.task_id, r.problem) for r in results if not r.valid]
    assert not invalid
