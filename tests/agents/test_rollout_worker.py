"""The rollout worker process end to end: real Kafka, the embedded engine serving a tiny model
from `rollstream model init`, bwrap sandboxes and a default task.

- episodes through `rollstream rollout` read back from Kafka: seq gap-free, every event type,
  token arrays that fold and that the engine reproduces, outcome/reward equal the verifier's;
- abort records on `rollout.control` end episodes as `truncated:deadline` (before and while
  they run);
- a worker killed with SIGKILL mid-run and restarted: every request finishes and re-run
  events carry the same ids (no id maps to two trajectories' worth of content);
- a worker given SIGTERM (to its process alone, as the pipeline supervisor sends it) drains:
  episodes in flight finish within `rollout.drain_timeout_s` and are committed (a new worker
  does not re-run them), no request written after the signal is taken; with a tiny drain
  timeout the unfinished ones stay uncommitted and a new worker re-runs them under the same ids.
"""

from __future__ import annotations

import asyncio
import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from aiokafka import TopicPartition

from agents.identity import group_id
from agents.settings import RolloutSettings
from agents.submit import TaskRef, request_event, submit_requests
from rollstream.config import Config
from rollstream.supervisor_settings import SupervisorSettings
from streams.aiokafka_private import refresh_metadata
from streams.assemble import fold_trajectory
from streams.bus import EventProducer, raw_consumer, read_topic
from streams.events import ROLLOUT_EVENT_TYPES, Event, decode_event, make_event
from streams.outcomes import Outcome
from streams.payloads import DeadLetterRecord, Limits, RolloutAbort
from streams.topics import topic_name
from trainer.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow
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


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("agents-model") / "model"
    sets = [arg for item in TINY_MODEL for arg in ("-s", item)]
    subprocess.run([*MODEL_CLI, "init", "--out", str(out), *sets], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("engine-log") / "engine.log").open("w")
    proc = subprocess.Popen(
        [*ENGINE_CLI, "serve", "--model", str(model_dir), "--port", str(port), "--context-length", "4096"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, f"engine exited with {proc.returncode}; see {log.name}"
        try:
            return httpx.get(f"{url}/get_model_info", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, "the engine to serve", timeout=120)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def one_task_root(default_tasks_dir: Path, tmp_path: Path) -> Path:
    """A task root holding one default task (the worker resolves tasks by directory name)."""
    first = sorted(d for d in default_tasks_dir.iterdir() if (d / "task.toml").is_file())[0]
    root = tmp_path / "tasks"
    shutil.copytree(first, root / first.name, symlinks=True)
    return root


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


def test_episodes_through_the_worker_process_and_kafka(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    task_dir = next(one_task_root.iterdir()).name
    task = TaskRef(task_dir, task_dir)
    short = Limits(max_turns=2, max_new_tokens_per_turn=16, context_cap=4096)
    long = Limits(max_turns=500, max_new_tokens_per_turn=16, context_cap=4096)
    normal = submit(kafka_config, "run-a", task, 0, 1, short)
    running, early = submit(kafka_config, "run-a", task, 1, 2, long)
    write_abort(kafka_config, "run-a", [early])  # aborted before any worker picks it up
    unservable = submit(kafka_config, "run-a", TaskRef("no-such-task", "no-such-task"), 2, 1, short)
    worker = Worker(
        kafka_config,
        one_task_root,
        engine_url,
        model_dir,
        tmp_path / "worker.log",
        "agent.max_format_errors=1000",
    )
    try:

        def first_turn() -> bool:
            events = read_events(kafka_config)
            return any(e.trajectory_id == running and e.type == "turn.generated" for e in events)

        wait_until(first_turn, "the long episode's first turn")
        write_abort(kafka_config, "run-a", [running])
        expected = {*normal, running, early}
        wait_until(lambda: expected <= finished_ids(read_events(kafka_config)), "every episode to finish")
    finally:
        worker.kill(signal.SIGTERM)
    check_dead_lettered_request(kafka_config, unservable[0])
    trajectories = by_trajectory(read_events(kafka_config))
    check_normal_episode(trajectories[normal[0]], model_dir)
    for aborted in (running, early):
        finished = trajectories[aborted][-1].data
        assert finished.outcome == Outcome.TRUNCATED_DEADLINE and finished.reward == 0.0, finished
    assert [e.type for e in trajectories[early]] == ["trajectory.started", "trajectory.finished"]
    assert "tests.ran" not in {e.type for e in trajectories[running]}


def check_dead_lettered_request(config: Config, trajectory_id: str) -> None:
    """A request naming a task the worker does not have is in `deadletter`, whole, with the reason."""
    consumed = asyncio.run(read_topic(config.kafka, config.topics, "deadletter", idle_s=0.5))
    letters = [c.event.data for c in consumed if isinstance(c.event.data, DeadLetterRecord)]
    assert len(letters) == 1, letters
    letter = letters[0]
    assert "no-such-task" in letter.reason and letter.topic.endswith("rollout.requests")
    request = decode_event(base64.b64decode(letter.value_b64))
    assert request.trajectory_id == trajectory_id and request.type == "rollout.requested"
    assert trajectory_id not in finished_ids(read_events(config))  # not run, not scored


def check_normal_episode(events: list[Event], model_dir: Path) -> None:
    events = sorted(events, key=lambda e: e.seq)
    assert [e.seq for e in events] == list(range(len(events))), "seq must be gap-free from 0"
    expected_types = set(ROLLOUT_EVENT_TYPES) - {"sandbox.failed"}
    assert {e.type for e in events} == expected_types
    folded = fold_trajectory(events)
    finished = events[-1].data
    tests = next(e.data for e in events if e.type == "tests.ran")
    assert finished.outcome == Outcome.TRUNCATED_TURNS and finished.reward == tests.reward
    assert folded.reward == tests.reward and folded.turns == finished.turns == 2
    turns = [e.data for e in events if e.type == "turn.generated"]
    assert sum(len(t.output_token_ids) for t in turns) == finished.generated_tokens == sum(folded.loss_mask)
    assert len(folded.token_ids) == turns[-1].context_tokens
    vocab = load_tokenizer(model_dir).get_vocab_size()
    for turn in turns:
        assert 0 < len(turn.output_token_ids) <= 16 and all(0 <= t < vocab for t in turn.output_token_ids)
        assert all(lp <= 0.0 for lp in turn.output_logprobs)
    # what the engine received and produced is the folded array: a full forward pass of the same
    # weights over it gives each output token the engine's logprob, and greedy picked the best
    check_against_forward_pass(folded.token_ids, folded.loss_mask, folded.rollout_logprobs, model_dir)


def check_against_forward_pass(
    tokens: list[int], mask: list[int], logprobs: list[float], model_dir: Path
) -> None:
    import torch

    from trainer.checkpoint import load_model

    with torch.no_grad():
        logits = load_model(model_dir)(torch.tensor([tokens]))[0].float()
    predicted = torch.log_softmax(logits[:-1], dim=-1)  # row i predicts token i + 1
    for i in range(1, len(tokens)):
        if mask[i]:
            row = predicted[i - 1]
            assert float(row[tokens[i]]) == pytest.approx(logprobs[i], abs=1e-3), f"token {i}"
            assert float(row.max() - row[tokens[i]]) < 1e-3, f"greedy token {i} is not the argmax"


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


def test_killed_worker_leaves_requests_to_rerun_with_the_same_ids(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "worker.log"
    expected = run_killed_and_rerun(kafka_config, one_task_root, engine_url, model_dir, log, "run-k", 4)
    events = read_events(kafka_config)
    started = [e.id for e in events if e.type == "trajectory.started"]
    assert len(started) > len(set(started)), "the killed worker's requests were re-run under the same ids"
    slots: dict[object, tuple[str | None, int]] = {}
    for event in events:  # downstream deduplication by id is sound: an id names one (trajectory, seq)
        slot = (event.trajectory_id, event.seq)
        assert slots.setdefault(event.id, slot) == slot
    for trajectory, own in by_trajectory(events).items():
        assert trajectory in expected
        check_incarnations(own)


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


def test_submit_command_writes_group_size_requests_per_task_with_stable_ids(
    kafka_config: Config, one_task_root: Path
) -> None:
    kafka, topics = kafka_config.kafka, kafka_config.topics
    sets = [f'kafka.bootstrap="{kafka.bootstrap}"', f'topics.prefix="{topics.prefix}"']
    args = [*ROLLOUT_CLI, "submit", "--tasks", str(one_task_root), "--group-size", "3", "--run", "run-s"]
    for _ in range(2):  # submitting the same run twice writes the same ids
        subprocess.run([*args, *[a for s in sets for a in ("-s", s)]], check=True, capture_output=True)
    consumed = asyncio.run(read_topic(kafka, topics, "rollout.requests", idle_s=0.5))
    requests = [c.event for c in consumed]
    assert len(requests) == 6 and len({e.id for e in requests}) == 3
    assert {e.data.attempt for e in requests} == {0, 1, 2} and {e.group_id for e in requests} == {
        group_id("run-s", next(one_task_root.iterdir()).name, 0)
    }
    assert all(e.data.limits.max_turns == kafka_config.policy.max_turns for e in requests)


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


def test_default_drain_fits_inside_the_supervisors_stop_window() -> None:
    window = SupervisorSettings().stop_timeout_s
    assert RolloutSettings().drain_timeout_s <= window - 3.0  # time left to commit and leave the group


def test_sigterm_lets_in_flight_episodes_finish_and_commits_them(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    task_dir = next(one_task_root.iterdir()).name
    task = TaskRef(task_dir, task_dir)
    limits = Limits(max_turns=4, max_new_tokens_per_turn=16, context_cap=4096)
    drained = set(submit(kafka_config, "run-d", task, 0, 2, limits))
    log = tmp_path / "worker.log"
    options = ("agent.max_format_errors=1000", "rollout.drain_timeout_s=120")
    first = Worker(kafka_config, one_task_root, engine_url, model_dir, log, *options)
    try:
        wait_until(lambda: drained <= turned_ids(read_events(kafka_config)), "every episode's first turn")
        at_signal = read_events(kafka_config)
        exit_s = terminate(first)
    finally:
        first.kill()
    in_flight = drained - finished_ids(at_signal)
    assert in_flight, "every episode finished before the signal: make them longer"
    later = set(submit(kafka_config, "run-d", task, 1, 1, limits))  # written while it drains or after
    events = read_events(kafka_config)
    assert drained <= finished_ids(events), f"in-flight episodes unfinished after the drain ({exit_s:.1f}s)"
    assert not later & started_ids(events), "a request written after SIGTERM was taken"
    source = {e.source for e in events if e.trajectory_id in drained}
    assert len(source) == 1, source

    second = Worker(kafka_config, one_task_root, engine_url, model_dir, log, *options)
    try:
        wait_until(lambda: later <= finished_ids(read_events(kafka_config)), "the later requests to finish")
    finally:
        second.kill(signal.SIGTERM)
    runs = by_trajectory(read_events(kafka_config))
    for trajectory in drained:  # committed: the new worker did not run them again
        assert [e.type for e in runs[trajectory]].count("trajectory.started") == 1, trajectory
        assert {e.source for e in runs[trajectory]} == source
    assert all(source.isdisjoint(e.source for e in runs[t]) for t in later)  # run by the new worker


def test_episodes_unfinished_at_the_drain_timeout_are_rerun_under_the_same_ids(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    task_dir = next(one_task_root.iterdir()).name
    limits = Limits(max_turns=6, max_new_tokens_per_turn=16, context_cap=4096)
    expected = set(submit(kafka_config, "run-t", TaskRef(task_dir, task_dir), 0, 2, limits))
    log = tmp_path / "worker.log"
    first = Worker(
        kafka_config,
        one_task_root,
        engine_url,
        model_dir,
        log,
        "agent.max_format_errors=1000",
        "rollout.drain_timeout_s=0.2",
    )
    try:
        wait_until(lambda: expected <= turned_ids(read_events(kafka_config)), "every episode's first turn")
        terminate(first)
    finally:
        first.kill()
    events = read_events(kafka_config)
    first_source = next(e.source for e in events if e.trajectory_id in expected)
    unfinished = expected - finished_ids(events)
    assert unfinished, "every episode finished within 0.2 s of the signal: make them longer"

    second = Worker(kafka_config, one_task_root, engine_url, model_dir, log, "agent.max_format_errors=1000")
    try:
        wait_until(lambda: expected <= finished_ids(read_events(kafka_config)), "every request to finish")
    finally:
        second.kill(signal.SIGTERM)
    runs = by_trajectory(read_events(kafka_config))
    for trajectory in unfinished:  # not committed: re-run by the new worker, under the same ids
        own = runs[trajectory]
        sources = {e.source for e in own}
        assert first_source in sources and len(sources) == 2, sources
        started = [e.id for e in own if e.type == "trajectory.started"]
        assert len(started) == 2 and len(set(started)) == 1, "the re-run wrote another trajectory.started id"
        finishing = {e.source for e in own if e.type == "trajectory.finished"}
        assert first_source not in finishing
        check_incarnations(own)


def test_requests_finished_but_uncommitted_are_not_run_again_by_the_next_worker(
    kafka_config: Config, one_task_root: Path, engine_url: str, model_dir: Path, tmp_path: Path
) -> None:
    """Killed after its episodes finished but before any commit: the next owner reads their
    `trajectory.finished` from the log and does not run them a second time."""
    task_dir = next(one_task_root.iterdir()).name
    task = TaskRef(task_dir, task_dir)
    limits = Limits(max_turns=2, max_new_tokens_per_turn=16, context_cap=4096)
    done = set(submit(kafka_config, "run-f", task, 0, 3, limits))
    log = tmp_path / "worker.log"
    first = Worker(kafka_config, one_task_root, engine_url, model_dir, log, "rollout.commit_interval_s=3600")
    try:
        wait_until(lambda: done <= finished_ids(read_events(kafka_config)), "every episode to finish")
    finally:
        first.kill(signal.SIGKILL)  # nothing committed: every request is handed to the next worker
    source = {e.source for e in read_events(kafka_config) if e.trajectory_id in done}
    later = set(submit(kafka_config, "run-f", task, 1, 1, limits))
    second = Worker(kafka_config, one_task_root, engine_url, model_dir, log)
    try:
        wait_until(lambda: later <= finished_ids(read_events(kafka_config)), "the later request to finish")
        wait_until(lambda: committed(kafka_config) >= len(done) + len(later), "every request committed")
    finally:
        second.kill(signal.SIGTERM)
    runs = by_trajectory(read_events(kafka_config))
    for trajectory in done:
        assert [e.type for e in runs[trajectory]].count("trajectory.finished") == 1, trajectory
        assert {e.source for e in runs[trajectory]} == source, "run again by the second worker"
    assert all(source.isdisjoint(e.source for e in runs[t]) for t in later)


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
