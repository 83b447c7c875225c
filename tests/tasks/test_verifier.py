"""The verifier in a real bwrap sandbox: reward 1 and 0 from real pytest runs; a test.sh that
crashes, times out, or writes garbage is a VerifierError (infrastructure), never reward 0."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollstream.config import Config
from sandboxes.backends import make_factory
from sandboxes.base import VerifierError
from sandboxes.tasks.check import check_task
from sandboxes.tasks.harbor import Task, TaskMetadata, load_task, write_task_files
from sandboxes.tasks.runtime import ensure_pytest_zip, verifier_script, write_runtime_files
from sandboxes.tasks.verifier import parse_reward, run_verifier

GOOD = "def add(a, b):\n    return a + b\n"
BUGGY = "def add(a, b):\n    return a - b\n"
TESTS = (
    "from calc import add\n\n"
    "def test_add():\n    assert add(2, 3) == 5\n\n"
    "def test_zero():\n    assert add(0, 0) == 0\n"
)
SOLVE = "#!/usr/bin/env bash\nset -e\nprintf 'def add(a, b):\\n    return a + b\\n' > src/calc.py\n"


def make_task(root: Path, base_config: Config, source: str, test_script: str | None = None) -> Task:
    task_dir = root / "calc-task"
    repo = task_dir / "environment" / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "src" / "calc.py").write_text(source)
    (repo / "tests" / "test_calc.py").write_text(TESTS)
    f2p, p2p = ["tests/test_calc.py::test_add"], ["tests/test_calc.py::test_zero"]
    task = Task(
        id="calc-task",
        dir=task_dir,
        instruction="add() is wrong\n",
        workspace=repo,
        metadata=TaskMetadata(fail_to_pass=tuple(f2p), pass_to_pass=tuple(p2p)),
    )
    script = test_script or verifier_script([*f2p, *p2p], ["src"], base_config.tasks.python)
    write_task_files(task_dir, task, test_sh=script, solve_sh=SOLVE)
    write_runtime_files(
        task_dir / "tests", ensure_pytest_zip(base_config.state_dir / "cache" / "runtime"), f2p, p2p
    )
    return load_task(task_dir)


async def verdict_for(task: Task, base_config: Config, timeout: float = 120.0):
    box = make_factory(base_config.sandbox).create(task.workspace)
    await box.start()
    try:
        return await run_verifier(box, task, timeout)
    finally:
        await box.stop()


async def test_correct_code_scores_one(tmp_path: Path, base_config: Config) -> None:
    verdict = await verdict_for(make_task(tmp_path, base_config, GOOD), base_config)
    assert verdict.reward == 1.0
    assert verdict.fail_to_pass == {"tests/test_calc.py::test_add": True}
    assert verdict.pass_to_pass == {"tests/test_calc.py::test_zero": True}
    assert verdict.duration_s > 0


async def test_buggy_code_scores_zero_with_per_test_results(tmp_path: Path, base_config: Config) -> None:
    verdict = await verdict_for(make_task(tmp_path, base_config, BUGGY), base_config)
    assert verdict.reward == 0.0
    assert verdict.fail_to_pass == {"tests/test_calc.py::test_add": False}
    assert verdict.pass_to_pass == {"tests/test_calc.py::test_zero": True}


async def test_edited_and_added_test_files_are_replaced_before_grading(
    tmp_path: Path, base_config: Config
) -> None:
    f2p_p2p = ["tests/test_calc.py::test_add", "tests/test_calc.py::test_zero"]
    script = verifier_script(f2p_p2p, ["src"], base_config.tasks.python, restore=["tests"])
    task = make_task(tmp_path, base_config, BUGGY, test_script=script)
    (task.tests_dir / "suite" / "tests").mkdir(parents=True)
    (task.tests_dir / "suite" / "tests" / "test_calc.py").write_text(TESTS)
    # the "agent" rewrote the test to pass against the bug, and added a conftest that patches add()
    (task.workspace / "tests" / "test_calc.py").write_text(TESTS.replace("== 5", "== -1"))
    patch = "import calc\ncalc.add = lambda a, b: a + b\n"
    (task.workspace / "tests" / "conftest.py").write_text(patch)
    assert (await verdict_for(task, base_config)).reward == 0.0
    (task.workspace / "src" / "calc.py").write_text(GOOD)
    assert (await verdict_for(task, base_config)).reward == 1.0


async def test_crashing_verifier_is_an_infra_error(tmp_path: Path, base_config: Config) -> None:
    task = make_task(tmp_path, base_config, GOOD, test_script="#!/usr/bin/env bash\necho boom >&2\nexit 3\n")
    with pytest.raises(VerifierError, match="no reward") as caught:
        await verdict_for(task, base_config)
    assert caught.value.kind == "verifier"
    assert "boom" in str(caught.value)


async def test_verifier_timeout_is_an_infra_error(tmp_path: Path, base_config: Config) -> None:
    script = '#!/usr/bin/env bash\nsleep 30\necho 1 > "$LOGS_DIR/reward.txt"\n'
    task = make_task(tmp_path, base_config, GOOD, test_script=script)
    with pytest.raises(VerifierError, match="timed out"):
        await verdict_for(task, base_config, timeout=2.0)


async def test_unreadable_reward_is_an_infra_error(tmp_path: Path, base_config: Config) -> None:
    script = '#!/usr/bin/env bash\necho "great job" > "$LOGS_DIR/reward.txt"\n'
    task = make_task(tmp_path, base_config, GOOD, test_script=script)
    with pytest.raises(VerifierError, match="unreadable reward"):
        await verdict_for(task, base_config)


async def test_reward_json_is_read(tmp_path: Path, base_config: Config) -> None:
    script = '#!/usr/bin/env bash\necho \'{"reward": 0.5}\' > "$LOGS_DIR/reward.json"\n'
    verdict = await verdict_for(make_task(tmp_path, base_config, GOOD, test_script=script), base_config)
    assert verdict.reward == 0.5
    assert verdict.fail_to_pass == {}


def test_parse_reward() -> None:
    assert parse_reward("1\n") == 1.0
    assert parse_reward('{"reward": 0.25, "extra": 1}') == 0.25
    for bad in ("", "yes", "true", '{"score": 1}', "[1]"):
        with pytest.raises(VerifierError):
            parse_reward(bad)


async def test_check_task_gold_one_and_no_change_zero(tmp_path: Path, base_config: Config) -> None:
    task = make_task(tmp_path, base_config, BUGGY)
    result = await check_task(make_factory(base_config.sandbox), task)
    assert (result.gold_reward, result.none_reward, result.valid) == (1.0, 0.0, True)
    broken = make_task(tmp_path / "other", base_config, GOOD)  # "bug" already fixed: no change scores 1
    result = await check_task(make_factory(base_config.sandbox), broken)
    assert not result.valid and "no change scores 1.0" in result.problem
