"""The rollout worker as a process, for its end-to-end tests (test_rollout_worker.py,
test_rollout_drain.py): a tiny model from `rollstream model init`, the embedded engine serving it,
a one-task root (those three are fixtures in tests/agents/conftest.py), `Worker` (a `rollstream
rollout` process), and readers of what it wrote."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from aiokafka import TopicPartition

from agents.identity import group_id
from agents.submit import TaskRef, request_event, submit_requests
from rollstream.config import Config
from streams.aiokafka_private import refresh_metadata
from streams.assemble import fold_trajectory
from streams.bus import EventProducer, raw_consumer, read_topic
from streams.events import Event, make_event
from streams.outcomes import Outcome
from streams.payloads import Limits, RolloutAbort
from streams.topics import topic_name

# the `rollstream` sub-apps run on their own: the worker skips the whole CLI's imports (torch)
ROLLOUT_CLI = [sys.executable, "-m", "rollstream.commands.rollout"]
SUB_APP = "import typer.main; from rollstream.commands.{} import app; typer.main.get_group(app)()"
MODEL_CLI = [sys.executable, "-c", SUB_APP.format("model")]
ENGINE_CLI = [sys.executable, "-c", SUB_APP.format("engine")]
TINY_MODEL = (
    "model.vocab_size=1024",
    "model.hidden_size=64",
    "model.num_layers=1",
    "model.intermediate_size=128",
)
WAIT_S = 180.0
EXIT_WAIT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT_S, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


class Worker:
    """A `rollstream rollout` process."""

    def __init__(self, config: Config, tasks: Path, engine: str, model: Path, log: Path, *extra: str) -> None:
        sets = [
            f'kafka.bootstrap="{config.kafka.bootstrap}"',
            f'topics.prefix="{config.topics.prefix}"',
            f'run.state_dir="{config.run.state_dir}"',
            "agent.temperature=0",
            "rollout.commit_interval_s=0.2",
            *extra,
        ]
        args = [*ROLLOUT_CLI, "--tasks", str(tasks), "--engine", engine, "--model", str(model)]
        self.log = log.open("a")
        self.proc = subprocess.Popen(
            [*args, "--concurrency", "8", *[a for s in sets for a in ("-s", s)]],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
        self.proc.wait(timeout=30)
        self.log.close()


def read_events(config: Config) -> list[Event]:
    consumed = asyncio.run(read_topic(config.kafka, config.topics, "rollout.events", idle_s=0.5))
    return [c.event for c in consumed]


def finished_ids(events: list[Event]) -> set[str]:
    return {e.trajectory_id for e in events if e.type == "trajectory.finished" and e.trajectory_id}


def by_trajectory(events: list[Event]) -> dict[str, list[Event]]:
    grouped: dict[str, list[Event]] = defaultdict(list)
    for event in events:
        grouped[event.trajectory_id or ""].append(event)
    return grouped


def submit(
    config: Config, run: str, task: TaskRef, group_index: int, attempts: int, limits: Limits
) -> list[str]:
    group = group_id(run, task.task_id, group_index)
    events = [
        request_event(
            run_id=run,
            group=group,
            task=task,
            attempt=a,
            retry=0,
            group_size=attempts,
            limits=limits,
            source="test",
        )
        for a in range(attempts)
    ]
    asyncio.run(submit_requests(config.kafka, config.topics, events))
    return [e.trajectory_id for e in events if e.trajectory_id]


def write_abort(config: Config, run: str, trajectories: list[str]) -> None:
    async def send() -> None:
        data = RolloutAbort(trajectory_ids=trajectories)
        event = make_event(
            data, run_id=run, seq=0, time_ns=time.time_ns(), source="test", id_key=f"abort:{trajectories[0]}"
        )
        async with EventProducer(config.kafka, config.topics) as producer:
            await producer.send_and_wait("rollout.control", event)

    asyncio.run(send())


def started_ids(events: list[Event]) -> set[str]:
    return {e.trajectory_id for e in events if e.type == "trajectory.started" and e.trajectory_id}


def turned_ids(events: list[Event]) -> set[str]:
    return {e.trajectory_id for e in events if e.type == "turn.generated" and e.trajectory_id}


def terminate(worker: Worker) -> float:
    """SIGTERM to the worker process alone (as `Supervisor.stop` sends it); seconds until it exited."""
    began = time.monotonic()
    worker.proc.send_signal(signal.SIGTERM)
    code = worker.proc.wait(timeout=EXIT_WAIT_S)
    worker.log.close()
    assert code == 0, f"the worker exited with {code} after SIGTERM; see {worker.log.name}"
    return time.monotonic() - began


def check_incarnations(events: list[Event]) -> None:
    """Each worker's run of the trajectory (its `source`) used the ids of (trajectory, seq), and the
    run that finished it is complete on its own. A re-run may sample differently from the killed
    run (engine batching is not bitwise deterministic), so the finishing run is what counts."""
    runs: dict[str, dict[int, Event]] = defaultdict(dict)
    for event in events:
        runs[event.source].setdefault(event.seq, event)
    ids_by_seq: dict[int, set[object]] = defaultdict(set)
    for run in runs.values():
        for seq, event in run.items():
            ids_by_seq[seq].add(event.id)
    assert all(len(ids) == 1 for ids in ids_by_seq.values()), "a re-run wrote different ids"
    finishing = [run for run in runs.values() if any(e.type == "trajectory.finished" for e in run.values())]
    assert finishing, "no run finished the trajectory"
    folded = fold_trajectory(finishing[-1].values())
    assert folded.outcome == Outcome.TRUNCATED_TURNS and folded.reward is not None


def committed(config: Config) -> int:
    """Requests the rollout workers' consumer group has committed, over every partition."""

    async def read() -> int:
        consumer = raw_consumer(config.kafka, [], config.rollout.consumer_group, "test-committed", True)
        await consumer.start()
        try:
            name = topic_name(config.topics, "rollout.requests")
            await refresh_metadata(consumer)  # a fresh consumer knows no partitions yet
            parts = consumer.partitions_for_topic(name) or set()
            offsets = [await consumer.committed(TopicPartition(name, p)) for p in parts]
            return sum(o or 0 for o in offsets)
        finally:
            await consumer.stop()

    return asyncio.run(read())


def run_killed_and_rerun(
    config: Config, tasks: Path, engine: str, model: Path, log: Path, run_id: str, attempts: int
) -> set[str]:
    """Submit a group, SIGKILL the first worker after its first turn, let a second finish; the ids."""
    task_dir = next(tasks.iterdir()).name
    limits = Limits(max_turns=2, max_new_tokens_per_turn=16, context_cap=4096)
    expected = set(submit(config, run_id, TaskRef(task_dir, task_dir), 0, attempts, limits))
    first = Worker(config, tasks, engine, model, log)
    try:
        wait_until(lambda: any(e.type == "turn.generated" for e in read_events(config)), "a first turn")
    finally:
        first.kill(signal.SIGKILL)
    second = Worker(config, tasks, engine, model, log)
    try:
        wait_until(lambda: expected <= finished_ids(read_events(config)), "every request to finish")
    finally:
        second.kill(signal.SIGTERM)
    return expected
