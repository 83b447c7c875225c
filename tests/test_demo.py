"""The main job end to end: `rollstream demo` on the real broker, sandboxes, engine, trainer and SQLite,
in a small version (a few tasks, one RL step); and nothing it started outlives it, whether it ends
normally, by Ctrl-C, or because a child keeps crashing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from sqlalchemy import create_engine, text

from rollstream.launcher.process import free_port
from tests.process_tree import LeakWatch

SMALL = [
    "learning.train_tasks=4",
    "learning.heldout_tasks=2",
    "learning.expert_groups_per_task=1",
    "learning.sft_epochs=1",
    "learning.rl_groups_ahead=2",
    "eval.attempts=1",
    "policy.group_size=2",
    "policy.drop_zero_variance=false",
    "trainer.groups_per_step=1",
    "rollout.concurrency=4",
    "sandbox.pool.warm_pool=0",
]


@pytest.fixture(scope="module")
def demo_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One state dir for the module: the first demo builds the SFT model, the others reuse it."""
    return tmp_path_factory.mktemp("demo") / ".rollstream"


def demo_command(state: Path, kafka_bootstrap: str, run: str, *extra: str) -> list[str]:
    settings = [
        *SMALL,
        f'run.name="{run}"',
        f'run.state_dir="{state}"',
        f'kafka.bootstrap="{kafka_bootstrap}"',
        f'topics.prefix="t-{uuid.uuid4().hex[:8]}-"',
        f"monitor.port={free_port()}",
        *extra,
    ]
    return [
        sys.executable,
        "-m",
        "rollstream",
        "demo",
        "--steps",
        "1",
        "--timeout",
        "600",
        *[a for s in settings for a in ("--set", s)],
    ]


def _logs(state: Path, run: str) -> str:
    return "\n".join(
        f"== {p.name}\n{p.read_text()[-1200:]}" for p in (state / "runs" / run / "logs").glob("*.log")
    )


def test_demo_trains_and_reports(kafka_bootstrap: str, demo_state: Path, tmp_path: Path) -> None:
    run = f"demo-test-{uuid.uuid4().hex[:6]}"
    watch = LeakWatch()
    process = subprocess.Popen(
        demo_command(demo_state, kafka_bootstrap, run),
        cwd=tmp_path,
        env=watch.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watch.follow(process.pid)
    out, err = process.communicate(timeout=900)
    watch.stop()
    assert process.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}\n{_logs(demo_state, run)}"
    summary = json.loads(out.strip().splitlines()[-1])
    assert (
        summary["version_after"] > summary["version_before"]
    )  # the trainer published, RL's model was evaluated
    assert 0.0 <= summary["pass1_before"] <= 1.0 and 0.0 <= summary["pass1_after"] <= 1.0
    watch.assert_none_left()

    assert (demo_state / "runs" / run / "report" / "index.html").exists()
    engine = create_engine(f"sqlite:///{demo_state / 'events.db'}")
    with engine.connect() as connection:
        steps = connection.execute(
            text("SELECT count(*) FROM events WHERE run_id = :r AND type = 'trainer.step'"), {"r": run}
        ).scalar_one()
        evals = connection.execute(
            text("SELECT run_id, count(*) FROM trajectories WHERE run_id LIKE :r GROUP BY run_id"),
            {"r": f"{run}-eval-%"},
        ).all()
    engine.dispose()
    assert steps == 1
    assert {r for r, _ in evals} == {
        f"{run}-eval-before",
        f"{run}-eval-after",
    }  # evals are events too, in SQL


def _wait_for(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _pids(root: int, needle: str) -> list[int]:
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for child in children:
        try:
            if needle in " ".join(child.cmdline()):
                out.append(child.pid)
        except psutil.Error:
            continue
    return out


def test_ctrl_c_stops_every_process(kafka_bootstrap: str, demo_state: Path, tmp_path: Path) -> None:
    run = f"demo-int-{uuid.uuid4().hex[:6]}"
    watch = LeakWatch()
    process = subprocess.Popen(
        demo_command(demo_state, kafka_bootstrap, run),
        cwd=tmp_path,
        env=watch.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    watch.follow(process.pid)
    try:
        _wait_for(lambda: _pids(process.pid, "rollstream train --run"), 600, "the trainer to start")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=120) == 130
    finally:
        if process.poll() is None:
            process.kill()
        watch.stop()
    watch.assert_none_left()


def test_a_child_that_keeps_crashing_ends_the_demo_and_nothing_is_left(
    kafka_bootstrap: str, demo_state: Path, tmp_path: Path
) -> None:
    run = f"demo-crash-{uuid.uuid4().hex[:6]}"
    watch = LeakWatch()
    command = demo_command(
        demo_state, kafka_bootstrap, run, "supervisor.max_restarts=1", "supervisor.backoff_s=0.2"
    )
    process = subprocess.Popen(
        command, cwd=tmp_path, env=watch.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    watch.follow(process.pid)
    try:
        killed: set[int] = set()
        for _ in range(2):  # one restart is allowed; the second crash gives the rollout worker up
            _wait_for(
                lambda: set(_pids(process.pid, "rollstream rollout --tasks")) - killed,
                600,
                "a rollout worker",
            )
            pid = next(iter(set(_pids(process.pid, "rollstream rollout --tasks")) - killed))
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        assert process.wait(timeout=180) == 1
        assert "given up" in process.stderr.read()  # type: ignore[union-attr]
    finally:
        if process.poll() is None:
            process.kill()
        watch.stop()
    watch.assert_none_left()
