"""The supervisor on real `rollstream` processes and the real broker: a SIGKILLed child comes back
with a new pid, a SIGSTOPped (hung) one is killed and restarted, a child that keeps failing is
given up, and `stop()` leaves nothing running."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from rollstream.config import Config
from rollstream.supervisor import ProcessExitedError, ProcessStatus, State, Supervisor
from rollstream.supervisor_settings import SupervisorSettings
from tests.process_tree import LeakWatch

FAST = SupervisorSettings(
    backoff_s=0.2,
    backoff_max_s=1.0,
    health_interval_s=0.2,
    heartbeat_interval_s=0.5,
    hung_after_s=30.0,
    startup_grace_s=90.0,
    stop_timeout_s=10.0,
)


def child_args(cfg: Config) -> list[str]:
    """The --set arguments that put a child on the test's broker and topics."""
    sets = [
        f'kafka.bootstrap="{cfg.kafka.bootstrap}"',
        f'topics.prefix="{cfg.topics.prefix}"',
        f'run.state_dir="{cfg.state_dir}"',
    ]
    return [arg for item in sets for arg in ("--set", item)]


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def one(sup: Supervisor, name: str) -> ProcessStatus:
    return next(s for s in sup.status() if s.name == name)


def beating(sup: Supervisor, name: str) -> bool:
    status = one(sup, name)
    return status.state is State.RUNNING and status.heartbeat_age_s is not None


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_sigkilled_child_is_restarted_with_a_new_pid(kafka_config: Config, tmp_path: Path) -> None:
    sup = Supervisor(tmp_path / "logs", child_args(kafka_config), FAST)
    with sup:
        first = sup.start("worker", ["worker"]).pid
        wait_for(lambda: beating(sup, "worker"), "the worker's first heartbeat")
        os.kill(first, signal.SIGKILL)
        wait_for(lambda: one(sup, "worker").restarts == 1 and beating(sup, "worker"), "the restart")
        status = one(sup, "worker")
        assert status.pid != first and gone(first)
        assert status.last_exit == -signal.SIGKILL and status.last_reason == "exited with code -9"
    assert one(sup, "worker").state is State.STOPPED and gone(sup.processes["worker"].pid)
    assert "restart 1: started" in (tmp_path / "logs" / "supervisor.log").read_text()
    assert "exited with code -9; restart 1" in (tmp_path / "logs" / "worker.log").read_text()


def test_a_hung_child_is_killed_and_restarted(kafka_config: Config, tmp_path: Path) -> None:
    settings = FAST.model_copy(update={"hung_after_s": 3.0})
    sup = Supervisor(tmp_path / "logs", child_args(kafka_config), settings)
    with sup:
        first = sup.start("sink", ["sink"]).pid
        wait_for(lambda: beating(sup, "sink"), "the sink's first heartbeat")
        os.kill(first, signal.SIGSTOP)  # alive, but its loop makes no progress
        began = time.monotonic()
        wait_for(lambda: one(sup, "sink").restarts == 1, "the hung sink's restart")
        assert time.monotonic() - began >= 2.0  # not before its beat was hung_after_s old (less a beat)
        assert one(sup, "sink").last_reason.startswith("hung: last heartbeat")
        wait_for(lambda: gone(first), "the hung sink to be gone", timeout_s=10)
        wait_for(lambda: beating(sup, "sink"), "the new sink's heartbeat")


def test_a_child_failing_past_max_restarts_is_given_up(kafka_config: Config, tmp_path: Path) -> None:
    settings = FAST.model_copy(update={"max_restarts": 2, "backoff_s": 0.1})
    with Supervisor(tmp_path / "logs", child_args(kafka_config), settings) as sup:
        sup.start("bad", ["worker", "--no-such-option"])  # a usage error: exits 2 at once, every time
        wait_for(lambda: one(sup, "bad").state is State.FAILED, "the supervisor to give up")
        status = one(sup, "bad")
        assert status.restarts == 2 and status.last_exit == 2
        with pytest.raises(ProcessExitedError, match="bad was given up after 2 restarts"):
            sup.check_alive()


def test_without_restarts_an_exit_is_reported_at_once_and_never_restarted(
    kafka_config: Config, tmp_path: Path
) -> None:
    """`restart=False` (evaluation, benchmarks): no heartbeat is watched, the first exit fails the run."""
    settings = FAST.model_copy(update={"health_interval_s": 60.0, "startup_grace_s": 0.5})
    with Supervisor(tmp_path / "logs", child_args(kafka_config), settings, restart=False) as sup:
        quiet = sup.start("quiet", ["worker"])  # would be "hung" past the grace if beats were watched
        sup.start("bad", ["worker", "--no-such-option"])
        wait_for(lambda: sup.processes["bad"].poll() is not None, "the usage error's exit")
        # the watcher's next pass is a minute away: check_alive looks itself
        with pytest.raises(ProcessExitedError, match=r"^bad exited with code 2; last lines of its log"):
            sup.check_alive()
        time.sleep(1.0)
        sup.check_once()
        assert one(sup, "bad").state is State.FAILED and one(sup, "bad").restarts == 0
        assert one(sup, "quiet").state is State.RUNNING and quiet.poll() is None
    assert gone(quiet.pid)


def test_stop_ends_every_child_and_what_it_started(kafka_config: Config, tmp_path: Path) -> None:
    watch = LeakWatch()
    sup = Supervisor(tmp_path / "logs", child_args(kafka_config), FAST, env=watch.env)
    watch.follow(os.getpid())  # before the children: what this process had already is not theirs
    with sup:
        sup.start("worker", ["worker"])
        sup.start("sink", ["sink"])
        wait_for(lambda: beating(sup, "worker") and beating(sup, "sink"), "both heartbeats")
    watch.stop()
    assert len([c for c in watch.descendants() if "rollstream" in c]) >= 2
    watch.assert_none_left(grace_s=0.5)


def test_stop_stops_the_latest_started_first_each_before_the_next(
    kafka_config: Config, tmp_path: Path
) -> None:
    """What started later may use what started earlier (a rollout worker draining its episodes, the
    engine they call): the earlier child gets SIGTERM only once the later one is gone. The later one
    is SIGSTOPped here, so it is gone only after `stop_timeout_s` and a SIGKILL; stopped together,
    the earlier one (which exits within a second of SIGTERM) would be gone first."""
    settings = FAST.model_copy(update={"stop_timeout_s": 3.0})
    sup = Supervisor(tmp_path / "logs", child_args(kafka_config), settings)
    gone_at: dict[str, float] = {}
    with sup:
        pids = {name: sup.start(name, ["worker"]).pid for name in ("earlier", "later")}
        wait_for(lambda: beating(sup, "earlier") and beating(sup, "later"), "both workers' heartbeats")
        os.kill(pids["later"], signal.SIGSTOP)
        watcher = threading.Thread(target=record_exits, args=(pids, gone_at), daemon=True)
        watcher.start()
    watcher.join(timeout=30)
    assert set(gone_at) == {"earlier", "later"}
    assert gone_at["later"] < gone_at["earlier"], gone_at
    assert one(sup, "later").last_exit == -signal.SIGKILL and one(sup, "earlier").last_exit == 0


def record_exits(pids: dict[str, int], gone_at: dict[str, float]) -> None:
    while len(gone_at) < len(pids):
        for name, pid in pids.items():
            if name not in gone_at and gone(pid):
                gone_at[name] = time.monotonic()
        time.sleep(0.02)
