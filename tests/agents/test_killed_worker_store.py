"""The SQL store after a rollout worker is killed mid-episode: exact, as the topics are.

Real broker, real `rollstream rollout` processes (embedded engine, tiny model, bwrap
sandboxes), real `rollstream sink` processes into SQLite and PostgreSQL. A worker is
killed with SIGKILL after its first turn; a new worker re-runs its unfinished
requests under the same event ids (from another source, with other timings and
possibly other samples). Then, on each backend:

- `replay --from-db` writes the same sft, rl and trajectories datasets as replay from
  the topics;
- the projections (`trajectories`, `turns`, `tool_calls`, `sandbox_lifecycle`) hold each
  trajectory once, with exactly the rows of the run that finished it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from rollstream.commands import replay
from rollstream.config import Config
from streams.events import Event
from streams.store import open_readonly
from tests.agents.rollout_worker_process import read_events, run_killed_and_rerun
from tests.store.expect import assert_projections, scalar
from tests.store.sinkrun import run_sink_until_idle

pytestmark = pytest.mark.slow
RUN = "run-killed"
ATTEMPTS = 2  # run at once (concurrency 8): the kill after the first turn leaves partial copies
DATASETS = ("sft", "rl", "trajectories")
app = typer.Typer()  # only the replay command (run as the app itself): no other command is imported
app.command(name="replay")(replay.command)


def finishing_runs(events: list[Event]) -> dict[str, list[Event]]:
    """Per trajectory, the events of the run (source) whose `trajectory.finished` was read first."""
    finisher: dict[str, str] = {}
    for event in events:
        if event.type == "trajectory.finished" and event.trajectory_id:
            finisher.setdefault(event.trajectory_id, event.source)
    runs: dict[str, dict[int, Event]] = {}
    for event in events:
        if event.trajectory_id in finisher and event.source == finisher[event.trajectory_id]:
            runs.setdefault(event.trajectory_id, {}).setdefault(event.seq, event)
    return {t: [run[s] for s in sorted(run)] for t, run in runs.items()}


def replay_datasets(config: Config, url: str, out: Path, from_db: bool) -> dict[str, str]:
    """Each dataset `rollstream replay` writes for the run (JSON lines, rows sorted by id)."""
    common = [
        "-s",
        f'kafka.bootstrap="{config.kafka.bootstrap}"',
        "-s",
        f'topics.prefix="{config.topics.prefix}"',
        "-s",
        f'db.url="{url}"',
        "-s",
        f'run.state_dir="{config.run.state_dir}"',
    ]
    written = {}
    for dataset in DATASETS:
        path = out / f"{dataset}-{'db' if from_db else 'topics'}.jsonl"
        args = ["--run", RUN, "--dataset", dataset, "--out", str(path), *common]
        result = CliRunner().invoke(app, [*args, "--from-db"] if from_db else args)
        assert result.exit_code == 0, result.output
        written[dataset] = path.read_text()
    return written


def test_store_after_a_killed_worker_equals_the_topics(
    config_factory: Callable[..., Config],
    one_task_root: Path,
    engine_url: str,
    model_dir: Path,
    sqlite_url: str,
    pg_url: str,
    tmp_path: Path,
) -> None:
    config = config_factory("db.sink_batch_size=5")  # SQLite: the two copies land in many transactions
    expected = run_killed_and_rerun(
        config, one_task_root, engine_url, model_dir, tmp_path / "worker.log", RUN, ATTEMPTS
    )
    events = read_events(config)
    finishing = finishing_runs(events)
    assert set(finishing) == expected
    rerun = {e.trajectory_id for e in events if e.source != finishing[e.trajectory_id or ""][0].source}
    assert rerun, "the killed worker left no partial copy to re-run; the test proves nothing"

    topics = replay_datasets(config, sqlite_url, tmp_path, from_db=False)
    assert topics["trajectories"].count("\n") == ATTEMPTS and topics["rl"].count("\n") == 1
    whole = config.model_copy(update={"db": config.db.model_copy(update={"sink_batch_size": 2000})})
    for url, sink_config in ((sqlite_url, config), (pg_url, whole)):
        run_sink_until_idle(sink_config, url, tmp_path / "sink.log")
        engine = open_readonly(url)
        assert scalar(engine, "SELECT COUNT(*) FROM events") == len({(e.id, e.source) for e in events})
        assert_projections(engine, [e for run in finishing.values() for e in run])
        engine.dispose()
        assert replay_datasets(config, url, tmp_path, from_db=True) == topics, url
