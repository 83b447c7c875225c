"""`rollstream bench chaos [--seed S] [--steps N]`: a training run that survives SIGKILL of every process.

A training run of the learning family (`rollstream.learning`: engine following the run's
`weights`, stream worker, SQL sink, rollout worker, trainer for `chaos.rl_steps` steps,
from the family's base model) on the three-broker cluster (`rollstream.launcher.kafka`,
replication factor 3, `min.insync.replicas` 2; producers always use acks=all), on fresh
topics and consumer groups, with:

- a seeded schedule (`bench.chaos_counts.kill_schedule`, `[chaos]`): each of sink, worker,
  rollout, trainer and engine SIGKILLed (its whole process group) `chaos.kills_each` times
  as groups form, restarted by the supervisor; one broker SIGKILLed and restarted after
  `chaos.broker_down_s`;
- sandbox start failures, sandbox hangs (start and exec) and engine 5xx injected at
  `chaos.fault_rate` (`sandbox.faults`, `client.faults`; no warm pool, so every start
  fault reaches an episode).

Zero-variance groups are kept and staleness is unlimited (the base model resolves
little, and the check is that every kept group is trained once, not that it learns).
After the trainer's last step no more groups are requested; the run waits for every
requested trajectory to finish and the sink to catch up, stops everything, and counts
from the topics and from SQL (`bench.chaos_counts`, `bench.chaos_sources`). The cluster is
stopped at the end when this run started it (`rollstream.launcher.kafka.running`).

Last line: `{"requested", "finished", "lost", "duplicated", "infra_injected",
"infra_recorded", "infra_errors_scored", "groups_trained_twice", "groups_skipped", "ratio",
...}`, ratio = finished / requested. Targets: every count that should be 0 is 0, ratio 1.0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from agents.curriculum import TaskPicker
from agents.submit import task_refs
from bench.chaos_counts import (
    Kill,
    count_infra,
    count_training,
    count_trajectories,
    count_versions,
    kill_schedule,
    parse_engine_loads,
)
from bench.chaos_sources import Records, read_sql, read_topics
from bench.learning import isolated
from rollstream.command_line import ConfigPath, Overrides, config_args, console, fail, new_run_id, read_config
from rollstream.config import Config
from rollstream.launcher import kafka as kafka_launcher
from rollstream.launcher.process import LauncherError
from rollstream.learning import (
    LEARNING_DEFAULTS,
    LearningPaths,
    prepare,
    start_rl_processes,
)
from rollstream.rl_feed import GroupLedger, submit_next_group
from rollstream.supervisor import ProcessExitedError, State, Supervisor
from streams.bus import EventConsumer, EventProducer
from streams.payloads import TrajectoryFinished

BROKERS = 3
PROCESSES = ("sink", "worker", "rollout", "trainer", "engine")
CHAOS_DEFAULTS = (
    *LEARNING_DEFAULTS,
    "policy.drop_zero_variance=false",
    "policy.max_staleness=-1",
    "sandbox.pool.warm_pool=0",
    "sandbox.pool.start_timeout_s=15.0",
    "sandbox.limits.command_timeout_s=20.0",
    "topics.groups_partitions=1",
    "topics.rollout_events_partitions=3",
    "topics.rollout_requests_partitions=3",
    "topics.trajectories_partitions=3",
    "rollout.concurrency=24",
    "client.retries=6",  # 0.5 s doubling: about 30 s, an engine's restart
    "sandbox.bwrap.server_grace_s=5.0",
    "trainer.checkpoint_every=2",
    "supervisor.backoff_s=0.5",
)


def chaos_overrides(cfg: Config, name: str) -> list[str]:
    """The run's own settings: cluster, faults, sizes, fresh topics and its own SQLite store."""
    c = cfg.chaos
    return [
        *kafka_launcher.cluster_overrides(cfg, BROKERS),
        f"sandbox.faults.start_failure_rate={c.fault_rate}",
        f"sandbox.faults.hang_rate={c.fault_rate}",
        f"sandbox.faults.seed={c.seed}",
        f"client.faults.engine_error_rate={c.fault_rate}",
        f"client.faults.seed={c.seed}",
        f"learning.seed={c.task_seed}",
        f"learning.train_tasks={c.train_tasks}",
        "learning.heldout_tasks=1",
        f"trainer.groups_per_step={c.groups_per_step}",
        f'db.url="sqlite:///{cfg.state_dir.resolve() / "chaos" / name / "events.db"}"',
        *isolated(name),
    ]


def command(
    seed: int | None = typer.Option(None, "--seed", help="kill schedule and fault draws (chaos.seed)"),
    steps: int | None = typer.Option(None, "--steps", min=1, help="trainer steps (chaos.rl_steps)"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Train through SIGKILLs of every process and a broker, with injected faults; count topics and SQL."""
    user = [
        *(overrides or []),
        *([f"chaos.seed={seed}"] if seed is not None else []),
        *([f"chaos.rl_steps={steps}"] if steps else []),
    ]
    first = read_config(config, [*CHAOS_DEFAULTS, *user])
    name = new_run_id(f"chaos-s{first.chaos.seed}")
    extra = [*CHAOS_DEFAULTS, *chaos_overrides(first, name), *user]
    cfg = read_config(config, extra)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a killed broker's retried errors
    child_args = config_args(config, extra)
    began = time.monotonic()
    try:
        console.print(
            f"the {BROKERS}-broker cluster on {cfg.kafka.bootstrap} (stopped at the end if started here)"
        )
        with kafka_launcher.running(cfg, BROKERS):  # a benchmark stops what it started
            figures = _run(cfg, prepare(cfg), child_args, name)
    except (LauncherError, ProcessExitedError, TimeoutError) as error:
        fail(str(error))
    figures["wall_s"] = round(time.monotonic() - began, 1)
    print(json.dumps(figures))


def _run(cfg: Config, paths: LearningPaths, config_args: list[str], run: str) -> dict[str, object]:
    c = cfg.chaos
    logs = cfg.state_dir / "runs" / run / "logs"
    kills = [t for t in PROCESSES for _ in range(c.kills_each)] + ["broker"]
    schedule = kill_schedule(c.seed, kills, c.schedule_start, c.schedule_end)
    console.print(
        f"run {run}; logs in {logs}; schedule: " + ", ".join(f"{k.target}@{k.at:.2f}" for k in schedule)
    )
    chaos = Chaos(cfg, schedule, random.Random(c.seed).randint(1, BROKERS))
    with Supervisor(logs, config_args, cfg.supervisor) as pipeline:
        start_rl_processes(cfg, paths, run, paths.base_model, c.rl_steps, pipeline, with_sink=True)
        live = asyncio.run(_drive(cfg, paths, run, pipeline, chaos))
        restarts = {s.name: s.restarts for s in pipeline.status()}
    topics = asyncio.run(read_topics(cfg.kafka, cfg.topics, run))
    sql = read_sql(cfg.db_url, run)
    loads = parse_engine_loads(_read(logs / "engine.log"), run)
    return summarise(topics, sql, loads, chaos, restarts, live)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


@dataclass
class Chaos:
    """The schedule and what was done of it."""

    cfg: Config
    schedule: list[Kill]
    broker: int
    done: list[Kill] = field(default_factory=list)
    broker_back_at: float | None = None
    broker_restarted: bool = False
    last_kill: float = 0.0

    def due(self, progress: float) -> list[Kill]:
        return [k for k in self.schedule if k.at <= progress and k not in self.done]

    async def fire(self, kill: Kill, pipeline: Supervisor) -> bool:
        """SIGKILL the target now (its process group); False when it is not running (try again later)."""
        if kill.target == "broker":
            await asyncio.to_thread(kafka_launcher.kill_node, self.cfg, self.broker, BROKERS)
            self.broker_back_at = time.monotonic() + self.cfg.chaos.broker_down_s
        else:
            state = {s.name: s.state for s in pipeline.status()}[kill.target]
            if state is not State.RUNNING:
                return False
            pid = pipeline.processes[kill.target].pid
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                return False
        self.done.append(kill)
        self.last_kill = time.monotonic()
        console.print(
            f"[bold red]SIGKILL[/] {kill.target}"
            + (f" (node {self.broker})" if kill.target == "broker" else "")
        )
        return True

    async def restart_broker_when_due(self) -> None:
        if (
            self.broker_back_at is not None
            and not self.broker_restarted
            and time.monotonic() >= self.broker_back_at
        ):
            await asyncio.to_thread(kafka_launcher.ensure_up, self.cfg, BROKERS)
            self.broker_restarted = True
            console.print(f"broker node {self.broker} restarted")


@dataclass
class Live:
    """What the driver saw while the run went on (requested and finished trajectory ids)."""

    requested: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)  # event ids of groups / trainer.steps already counted
    drain_s: float = 0.0


async def _drive(cfg: Config, paths: LearningPaths, run: str, pipeline: Supervisor, chaos: Chaos) -> Live:
    """Request groups until the trainer's last step, killing on schedule; then drain."""
    c, refs, ledger, live = cfg.chaos, task_refs(paths.train_tasks), GroupLedger(), Live()
    picker = TaskPicker(len(refs), retire_solved=False)  # every task in turn: the counts, not learning
    total = c.rl_steps * c.groups_per_step
    shorts = ("groups", "trainer.steps", "rollout.requests", "rollout.events")
    deadline = time.monotonic() + c.run_timeout_s
    with _progress() as progress:
        bar = progress.add_task("chaos", total=total, kills="", step=0)
        async with (
            EventProducer(cfg.kafka, cfg.topics) as producer,
            EventConsumer(cfg.kafka, cfg.topics, shorts, group_id=None, name=f"chaos-{run}") as consumer,
        ):
            while not pipeline.done("trainer"):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the trainer did not finish within {c.run_timeout_s:.0f} s")
                while ledger.unsettled < c.groups_ahead:
                    await submit_next_group(cfg, producer, run, refs, picker, source="chaos")
                    ledger.submitted += 1
                await producer.flush()
                await _take(consumer, run, ledger, live)
                due = chaos.due(min(1.0, ledger.formed / total))
                if due and time.monotonic() - chaos.last_kill >= c.min_kill_gap_s:
                    await chaos.fire(due[0], pipeline)
                await chaos.restart_broker_when_due()
                pipeline.check_alive()
                kills = " ".join(k.target for k in chaos.done)
                progress.update(bar, completed=min(total, ledger.formed), kills=kills, step=ledger.step)
            await chaos.restart_broker_when_due()
            live.drain_s = await _drain(cfg, consumer, run, ledger, live, pipeline, progress, bar)
    await _wait_for_sink(cfg, run, len(live.finished), pipeline)
    return live


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]chaos[/] groups"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TextColumn("step {task.fields[step]}"),
        TextColumn("killed: {task.fields[kills]}"),
        TimeElapsedColumn(),
        console=console,
    )


async def _take(consumer: EventConsumer, run: str, ledger: GroupLedger, live: Live) -> None:
    for item in await consumer.batch(timeout_ms=500):
        event = item.event
        if event.run_id != run:
            continue
        if item.topic == "rollout.requests" and event.trajectory_id:
            live.requested.add(event.trajectory_id)
        elif isinstance(event.data, TrajectoryFinished) and event.trajectory_id:
            live.finished.add(event.trajectory_id)
        elif item.topic in ("groups", "trainer.steps") and str(event.id) not in live.seen:
            live.seen.add(str(event.id))  # a restarted trainer re-writes its steps under the same ids
            ledger.record(event.data)


async def _drain(
    cfg: Config,
    consumer: EventConsumer,
    run: str,
    ledger: GroupLedger,
    live: Live,
    pipeline: Supervisor,
    progress: Progress,
    bar: object,
) -> float:
    """Wait until every requested trajectory has finished (infra re-runs included)."""
    began = time.monotonic()
    quiet_since = time.monotonic()
    while True:
        before = (len(live.requested), len(live.finished))
        await _take(consumer, run, ledger, live)
        if (len(live.requested), len(live.finished)) != before:
            quiet_since = time.monotonic()
        left = len(live.requested - live.finished)
        progress.update(bar, kills=f"draining: {left} trajectories left")  # type: ignore[arg-type]
        if left == 0 and time.monotonic() - quiet_since > 5.0:
            return round(time.monotonic() - began, 1)
        if time.monotonic() - began > cfg.chaos.drain_timeout_s:
            console.print(f"[yellow]drain timed out with {left} trajectories unfinished[/]")
            return round(time.monotonic() - began, 1)
        pipeline.check_alive()


async def _wait_for_sink(cfg: Config, run: str, finished: int, pipeline: Supervisor) -> None:
    deadline = time.monotonic() + cfg.chaos.sink_timeout_s
    while time.monotonic() < deadline:
        try:
            got = len(
                {f.trajectory_id for f in (await asyncio.to_thread(read_sql, cfg.db_url, run)).finishes}
            )
        except Exception:  # the store may not exist yet or be mid-write; ask again
            got = -1
        if got >= finished:
            return
        pipeline.check_alive()
        await asyncio.sleep(3.0)
    console.print("[yellow]the sink did not catch up in time: SQL counts are partial[/]")


def summarise(
    topics: Records, sql: Records, loads: list[int], chaos: Chaos, restarts: dict[str, int], live: Live
) -> dict[str, object]:
    """The final figures: the headline keys (worst of topics and SQL) and each source's counts."""
    t_traj, s_traj = (
        count_trajectories(topics.requested, topics.finishes),
        count_trajectories(topics.requested, sql.finishes),
    )
    t_infra = count_infra(topics.finishes, topics.assembled, topics.groups)
    s_infra = count_infra(sql.finishes, [], sql.groups)
    t_train, s_train = count_training(topics.groups, topics.steps), count_training(sql.groups, sql.steps)
    versions = count_versions(topics.published, loads, topics.generated_versions)
    finished = min(t_traj.finished, s_traj.finished)
    killed = {target: sum(k.target == target for k in chaos.done) for target in (*PROCESSES, "broker")}
    return {
        "requested": t_traj.requested,
        "finished": finished,
        "lost": max(t_traj.lost, s_traj.lost),
        "duplicated": max(t_traj.duplicated, s_traj.duplicated),
        "infra_injected": t_infra.injected,
        "infra_recorded": s_infra.injected - s_infra.injected_unrecorded,
        "infra_errors_scored": max(t_infra.scored, s_infra.scored),
        "groups_trained_twice": max(t_train.trained_twice, s_train.trained_twice),
        "groups_skipped": max(t_train.skipped, s_train.skipped),
        "groups_out_of_order": max(t_train.out_of_order, s_train.out_of_order),
        "versions_published": versions.published,
        "versions_loaded": versions.loaded,
        "last_published": versions.last_published,
        "last_loaded": versions.last_loaded,
        "killed": killed,
        "restarts": restarts,
        "broker_restarted": chaos.broker_restarted,
        "drain_s": live.drain_s,
        "topics": {
            "trajectories": _plain(t_traj),
            "infra": asdict(t_infra),
            "training": asdict(t_train),
            "sandbox_failed_injected": topics.sandbox_failed_injected,
            "versions_generated": versions.generated,
        },
        "sql": {
            "trajectories": _plain(s_traj),
            "infra": asdict(s_infra),
            "training": asdict(s_train),
            "versions_published": len(set(sql.published)),
        },
        "ratio": round(finished / t_traj.requested, 4) if t_traj.requested else None,
    }


def _plain(counts: object) -> dict[str, object]:
    data = asdict(counts)  # type: ignore[call-overload]
    data["lost_ids"] = list(data["lost_ids"])[:5]
    return data
