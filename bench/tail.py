"""`rollstream bench tail`: the long tail, synchronous steps vs fully asynchronous with a group deadline.

What is simulated and what is real. The workload is `bench.workload` (the same
reference profile as `bench rollout-sim`: sandbox start, ~4.4 s LLM calls, 84%
of episodes running to the 80-turn cap, median resolved episode 8 turns); each
episode's plan gives the duration of every step, in workload seconds, on a
discrete-event clock (no sleeping, no Kafka). Everything downstream of the
rollout is the real code: every episode is written as its rollout events
(`trajectory.started` when it starts; turns, tool calls, tests and
`trajectory.finished` when it ends) and fed to the real `StreamProcessor`, which
folds trajectories, forms groups with `form_group` and, in the asynchronous
run, applies the group deadline on the simulated clock (`tick`), writing the
`RolloutAbort`s the simulated rollout side obeys (the aborted episodes end at
that moment as `truncated:deadline`).

- sync (the reference run's baseline): each step starts `--groups-per-step` x
  group size episodes at once and waits for all of them; no deadline.
- async: the same number of rollout slots kept busy all the time (a freed slot
  takes the next attempt at once); a step is every `--groups-per-step` groups
  formed; the group deadline (`--deadline-s`, workload seconds) aborts stragglers.

Figures (averaged over steps; the first async step, the ramp-up, is left out):
- step_s: time per step (sync: its makespan; async: between step boundaries);
- tail share: over the trajectories a step consumes, the share of its rollout
  wall time (from the earliest start among them to the step's end) that passes
  after 90% of them have finished; for sync this is the reference run's figure.
ratio = sync step time / async step time. The deadline's cost is reported too:
the share of episodes the deadline cut that would have resolved.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass, field

import typer
from rich.console import Console
from rich.progress import Progress

from bench.figures import percentile
from bench.workload import EpisodePlan, WorkloadProfile, plan_episode
from rollstream.command_line import ConfigPath, Overrides, read_config
from streams.events import Event, make_event
from streams.outcomes import Outcome
from streams.payloads import (
    Limits,
    Payload,
    SandboxReady,
    TestsRan,
    ToolExecuted,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
)
from streams.processor import Emit, StreamProcessor
from streams.settings import PolicySettings

console = Console(stderr=True)
RUN = "bench-tail"
NS = 1_000_000_000
T0_NS = 1_700_000_000 * NS


@dataclass
class Episode:
    trajectory_id: str
    group_id: str
    attempt: int
    plan: EpisodePlan
    start_s: float

    @property
    def natural_end_s(self) -> float:
        return self.start_s + self.plan.total_s


def _ns(seconds: float) -> int:
    return T0_NS + int(seconds * NS)


def _event(ep: Episode, data: Payload, seq: int, at_s: float) -> Event:
    return make_event(
        data,
        run_id=RUN,
        seq=seq,
        time_ns=_ns(at_s),
        source="sim",
        group_id=ep.group_id,
        trajectory_id=ep.trajectory_id,
        task_id=ep.group_id,
    )


def started_event(ep: Episode, group_size: int, turn_cap: int) -> Event:
    data = TrajectoryStarted(
        attempt=ep.attempt, group_size=group_size, limits=Limits(max_turns=turn_cap), prompt_token_ids=[1, 2]
    )
    return _event(ep, data, 0, ep.start_s)


def _turns(ep: Episode, end_s: float | None) -> tuple[list[tuple[Payload, float]], float]:
    """(payload, time) of the turns that end by `end_s` (all when None), and the time after them."""
    plan, out = ep.plan, []
    t = ep.start_s + plan.sandbox_start_s
    out.append(
        (
            SandboxReady(
                backend="sim", sandbox_id=ep.trajectory_id, queue_wait_s=0, start_s=plan.sandbox_start_s
            ),
            t,
        )
    )
    for index, llm_s in enumerate(plan.llm_s):
        tool_s = plan.tool_s[index] if index < len(plan.tool_s) else 0.0
        if end_s is not None and t + llm_s + tool_s > end_s:
            break
        t, turn = t + llm_s, index + 1
        out.append(
            (
                TurnGenerated(
                    turn=turn,
                    observation_token_ids=[3] if turn > 1 else [],
                    output_token_ids=[4, 5],
                    output_logprobs=[-0.1, -0.2],
                    output_versions=[0, 0],
                    finish_reason="stop",
                    engine_id="sim",
                    weight_version=0,
                    context_tokens=2 + 3 * turn,
                    latency_s=llm_s,
                ),
                t,
            )
        )
        if index < len(plan.tool_s):
            t += tool_s
            out.append(
                (
                    ToolExecuted(
                        turn=turn,
                        command="ls",
                        exit_code=0,
                        output="",
                        output_bytes=0,
                        truncated=False,
                        duration_s=tool_s,
                    ),
                    t,
                )
            )
    return out, t


def rest_events(ep: Episode, end_s: float | None) -> list[Event]:
    """Events after `trajectory.started`: to the plan's end, or cut at `end_s` (an abort)."""
    plan = ep.plan
    out, t = _turns(ep, end_s)
    turns = sum(isinstance(data, TurnGenerated) for data, _ in out)
    if end_s is not None:
        outcome, reward, t = Outcome.TRUNCATED_DEADLINE, 0.0, end_s
    else:
        reward = 1.0 if plan.resolved else 0.0
        outcome = Outcome.TRUNCATED_TURNS
        if plan.submits:
            outcome = Outcome.RESOLVED if plan.resolved else Outcome.UNRESOLVED
        t += plan.verifier_s
        out.append(
            (
                TestsRan(
                    fail_to_pass={"t": plan.resolved},
                    pass_to_pass={},
                    duration_s=plan.verifier_s,
                    reward=reward,
                ),
                t,
            )
        )
    finished = TrajectoryFinished(
        outcome=outcome,
        reward=reward,
        turns=turns,
        generated_tokens=2 * turns,
        context_tokens=2 + 3 * turns,
        last_seq=len(out) + 1,
    )
    out.append((finished, t))
    return [_event(ep, data, seq, at) for seq, (data, at) in enumerate(out, start=1)]


@dataclass
class Tracker:
    """Group records the processor wrote, with the simulated time they were written."""

    processor: StreamProcessor
    formed: list[tuple[float, str]] = field(default_factory=list)
    aborts: list[tuple[float, list[str]]] = field(default_factory=list)

    def feed(self, events: list[Event], at_s: float) -> None:
        for event in events:
            self._record(self.processor.feed(event), at_s)

    def tick(self, at_s: float) -> None:
        self._record(self.processor.tick(_ns(at_s)), at_s)

    def _record(self, outputs: list, at_s: float) -> None:  # type: ignore[type-arg]
        for output in outputs:
            if isinstance(output, Emit) and output.topic == "groups":
                self.formed.append((at_s, output.event.group_id or ""))
            elif isinstance(output, Emit) and output.topic == "rollout.control":
                self.aborts.append((at_s, list(output.event.data.trajectory_ids)))  # type: ignore[attr-defined]


def step_tail_share(episodes: list[Episode], ends: dict[str, float], step_end: float) -> float:
    """Share of [earliest start, step end] after 90% of these episodes finished."""
    t90 = percentile([ends[e.trajectory_id] for e in episodes], 0.9)
    start = min(e.start_s for e in episodes)
    return max(0.0, step_end - t90) / (step_end - start) if step_end > start else 0.0


def attempts(
    profile: WorkloadProfile, group_size: int, prefix: str
) -> Iterator[tuple[str, int, EpisodePlan]]:
    index = 0
    while True:
        group_id = f"{prefix}g{index:05d}"
        for attempt in range(group_size):
            trajectory_id = f"{group_id}/a{attempt}"
            yield group_id, attempt, plan_episode(f"{trajectory_id}", profile)
        index += 1


def run_sync(
    profile: WorkloadProfile, policy: PolicySettings, groups_per_step: int, steps: int, progress: Progress
) -> tuple[list[float], list[float]]:
    """Per step: (makespan, tail share). Every step's episodes start together; no deadline."""
    tracker = Tracker(StreamProcessor(policy.model_copy(update={"group_deadline_s": 0.0})))
    group_size = policy.group_size
    source = attempts(profile, group_size, "sync-")
    step_times, tails, t = [], [], 0.0
    task = progress.add_task("sync: each step waits for its batch", total=steps)
    for _ in range(steps):
        batch = [
            Episode(f"{g}/a{a}", g, a, plan, t)
            for g, a, plan in (next(source) for _ in range(groups_per_step * group_size))
        ]
        for ep in batch:
            tracker.feed([started_event(ep, group_size, profile.turn_cap)], t)
        ends = {ep.trajectory_id: ep.natural_end_s for ep in sorted(batch, key=lambda e: e.natural_end_s)}
        for ep in sorted(batch, key=lambda e: e.natural_end_s):
            tracker.feed(rest_events(ep, None), ep.natural_end_s)
        step_end = max(at for at, _ in tracker.formed[-groups_per_step:])
        step_times.append(step_end - t)
        tails.append(step_tail_share(batch, ends, step_end))
        t = step_end
        progress.advance(task)
    return step_times, tails


class AsyncSim:
    """Rollout slots kept busy; episodes end naturally or when the processor's deadline aborts them."""

    def __init__(self, profile: WorkloadProfile, policy: PolicySettings, slots: int) -> None:
        group_size = policy.group_size
        self.tracker = Tracker(StreamProcessor(policy))
        self.profile, self.slots, self.group_size = profile, slots, group_size
        self.source = attempts(profile, group_size, "async-")
        self.heap: list[tuple[float, int, str]] = []
        self.running: dict[str, Episode] = {}
        self.episodes: dict[str, Episode] = {}
        self.ends: dict[str, float] = {}
        self.cut = self.cut_resolved = 0

    def start(self, t: float) -> None:
        while len(self.running) < self.slots:
            group_id, attempt, plan = next(self.source)
            ep = Episode(f"{group_id}/a{attempt}", group_id, attempt, plan, t)
            self.running[ep.trajectory_id] = self.episodes[ep.trajectory_id] = ep
            self.tracker.feed([started_event(ep, self.group_size, self.profile.turn_cap)], t)
            heapq.heappush(self.heap, (ep.natural_end_s, len(self.episodes), ep.trajectory_id))

    def finish(self, trajectory_id: str, t: float, aborted: bool) -> None:
        ep = self.running.pop(trajectory_id, None)
        if ep is None:
            return  # already aborted: its natural end no longer happens
        self.ends[trajectory_id] = t
        if aborted:
            self.cut += 1
            self.cut_resolved += ep.plan.resolved
        self.tracker.feed(rest_events(ep, t if aborted else None), t)

    def run_until(self, groups: int, progress: Progress) -> None:
        """Advance the clock (episode ends; a deadline tick each simulated second) until `groups` formed."""
        task = progress.add_task("async: slots always busy, group deadline", total=groups)
        self.start(0.0)
        next_tick = 1.0
        while len(self.tracker.formed) < groups:
            if self.heap and self.heap[0][0] <= next_tick:
                t, _, trajectory_id = heapq.heappop(self.heap)
                self.finish(trajectory_id, t, aborted=False)
            else:
                t, next_tick = next_tick, next_tick + 1.0
                self.tracker.tick(t)
                while self.tracker.aborts:
                    for trajectory_id in self.tracker.aborts.pop()[1]:
                        self.finish(trajectory_id, t, aborted=True)
            self.start(t)
            progress.update(task, completed=len(self.tracker.formed))


def run_async(
    profile: WorkloadProfile,
    policy: PolicySettings,
    groups_per_step: int,
    steps: int,
    deadline_s: float,
    progress: Progress,
) -> tuple[list[float], list[float], AsyncSim]:
    """Per step after the first: (time between step boundaries, tail share)."""
    # aborted episodes end at the abort in this simulation, so no grace is needed
    policy = policy.model_copy(update={"group_deadline_s": deadline_s, "abort_grace_s": 0.0})
    sim = AsyncSim(profile, policy, groups_per_step * policy.group_size)
    sim.run_until(steps * groups_per_step, progress)
    return _async_steps(sim, groups_per_step)


def _async_steps(sim: AsyncSim, per_step: int) -> tuple[list[float], list[float], AsyncSim]:
    """Step times and tail shares from the groups formed, every `per_step` groups one step."""
    members: dict[str, list[Episode]] = {}
    for ep in sim.episodes.values():
        if ep.trajectory_id in sim.ends:
            members.setdefault(ep.group_id, []).append(ep)
    formed = sim.tracker.formed
    boundaries = [formed[i][0] for i in range(per_step - 1, len(formed), per_step)]
    step_times = [b - a for a, b in itertools.pairwise(boundaries)]
    tails = []
    for k in range(1, len(boundaries)):
        episodes = [
            ep
            for _, group_id in formed[k * per_step : (k + 1) * per_step]
            for ep in members.get(group_id, [])
        ]
        tails.append(step_tail_share(episodes, sim.ends, boundaries[k]))
    return step_times, tails, sim


def command(
    groups_per_step: int = typer.Option(16, "--groups-per-step"),
    group_size: int = typer.Option(8, "--group-size"),
    steps: int = typer.Option(6, "--steps"),
    deadline_s: float = typer.Option(150.0, "--deadline-s", help="group deadline, workload seconds"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Tail share and step time: synchronous steps vs asynchronous with the group deadline (simulated)."""
    cfg = read_config(config, overrides)
    # the config's policies, with this run's group size; versions never advance here, so no staleness
    policy = cfg.policy.model_copy(update={"group_size": group_size, "max_staleness": -1})
    profile = WorkloadProfile()
    with Progress(console=console) as progress:
        sync_steps, sync_tails = run_sync(profile, policy, groups_per_step, steps, progress)
        async_steps, async_tails, sim = run_async(
            profile, policy, groups_per_step, steps + 1, deadline_s, progress
        )
    sync_step, async_step = sum(sync_steps) / len(sync_steps), sum(async_steps) / len(async_steps)
    console.print(
        f"{groups_per_step} groups x {group_size} per step, {len(sim.episodes)} async episodes; deadline "
        f"{deadline_s:.0f}s cut {sim.cut} episodes, {sim.cut_resolved} of which would have resolved"
    )
    print(
        json.dumps(
            {
                "sync_tail_share": round(sum(sync_tails) / len(sync_tails), 4),
                "async_tail_share": round(sum(async_tails) / len(async_tails), 4),
                "sync_step_s": round(sync_step, 2),
                "async_step_s": round(async_step, 2),
                "ratio": round(sync_step / async_step, 3),
                "deadline_s": deadline_s,
                "deadline_cut_share": round(sim.cut / max(1, len(sim.ends)), 4),
                "deadline_cut_resolved": sim.cut_resolved,
            }
        )
    )
