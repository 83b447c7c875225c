"""`rollstream up` as a user runs it (a subprocess on the real broker): it ends normally after
--for, on SIGINT, and when a child keeps crashing past supervisor.max_restarts; whichever way,
no process it started is left running (`tests.process_tree`)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rollstream.config import Config
from rollstream.launcher.process import free_port
from tests.process_tree import LeakWatch
from tests.supervisor.test_supervisor import child_args, wait_for
from trainer.checkpoint import init_model_dir
from trainer.settings import ModelSettings

QUICK = [
    "supervisor.backoff_s=0.1",
    "supervisor.health_interval_s=0.2",
    "supervisor.heartbeat_interval_s=0.5",
    "live.refresh_s=0.5",
]


def start_up(
    cfg: Config, cwd: Path, *args: str, sets: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[str], LeakWatch]:
    watch = LeakWatch()
    overrides = [arg for item in (*QUICK, *sets) for arg in ("--set", item)]
    command = [sys.executable, "-m", "rollstream", "up", *args, *child_args(cfg), *overrides]
    proc = subprocess.Popen(
        command, cwd=cwd, env=watch.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    watch.follow(proc.pid)
    return proc, watch


def finish(proc: subprocess.Popen[str], watch: LeakWatch, timeout_s: float = 60.0) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout_s)
    watch.stop()
    return proc.returncode, out


def test_up_ends_after_its_time_and_stops_what_it_started(kafka_config: Config, tmp_path: Path) -> None:
    proc, watch = start_up(kafka_config, tmp_path, "--engines", "0", "--rollout-workers", "0", "--for", "4")
    code, out = finish(proc, watch)
    assert code == 0, out
    assert "stopped every process" in out
    assert sum("rollstream worker" in c or "rollstream sink" in c for c in watch.descendants()) >= 2, out
    watch.assert_none_left()


def test_up_gives_up_on_a_child_that_keeps_crashing_and_stops_the_rest(
    kafka_config: Config, tmp_path: Path
) -> None:
    proc, watch = start_up(
        kafka_config,
        tmp_path,
        "--engines",
        "0",
        "--rollout-workers",
        "0",
        sets=("supervisor.max_restarts=1", 'db.url="sqlite:////proc/no-such-dir/events.db"'),
    )
    code, out = finish(proc, watch, timeout_s=120)
    assert code == 1, out
    assert "sink was given up after 1 restarts" in out
    assert any("rollstream worker" in c for c in watch.descendants())  # the healthy one was stopped too
    watch.assert_none_left()


@pytest.mark.slow
def test_up_runs_every_process_type_and_sigint_stops_them_all(
    kafka_config: Config, default_tasks_dir: Path, tmp_path: Path
) -> None:
    model = init_model_dir(ModelSettings(), tmp_path / "model")
    run = f"up-{uuid.uuid4().hex[:6]}"
    tasks = default_tasks_dir.resolve()
    sets = (
        f'model.path="{model}"',
        f'tasks.root="{tasks}"',
        f"engine.port={free_port()}",
        "sandbox.pool.warm_pool=1",
        "supervisor.hung_after_s=120",
    )
    proc, watch = start_up(kafka_config, tmp_path, "--run", run, sets=sets)
    logs = kafka_config.state_dir / "runs" / run / "logs"
    names = ("engine", "worker", "sink", "rollout", "trainer")

    def every_one_beats() -> bool:
        assert proc.poll() is None, proc.communicate()[0]
        return all((logs / f"{name}.heartbeat").exists() for name in names)

    wait_for(every_one_beats, "a heartbeat from every process", timeout_s=240)
    wait_for(
        lambda: any(c.startswith("bwrap") for c in watch.descendants()), "the warm sandbox", timeout_s=60
    )
    proc.send_signal(signal.SIGINT)
    began = time.monotonic()
    code, out = finish(proc, watch, timeout_s=60)
    assert code == 0, out
    assert time.monotonic() - began < 30  # inside the stop timeout: every child took SIGTERM
    restarts = (logs / "supervisor.log").read_text()
    assert "restart" not in restarts, restarts  # nothing crashed on the way
    watch.assert_none_left()


def test_children_die_with_a_sigkilled_up(kafka_config: Config, tmp_path: Path) -> None:
    proc, watch = start_up(kafka_config, tmp_path, "--engines", "0", "--rollout-workers", "0")
    logs = kafka_config.state_dir / "runs"
    wait_for(lambda: len(list(logs.glob("*/logs/*.heartbeat"))) == 2, "both heartbeats", timeout_s=90)
    proc.kill()  # no stop(): PR_SET_PDEATHSIG is what ends the children
    finish(proc, watch)
    assert len(watch.descendants()) >= 2
    watch.assert_none_left(grace_s=20)
