"""The live view's fold (`RunView`, pure: events in, counts out), its renderer, and its follower
on the real broker."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console

from rollstream.config import Config
from rollstream.live_render import render_run
from rollstream.live_view import RunFollower, RunView
from rollstream.supervisor import ProcessStatus, State
from streams.bus import EventProducer
from streams.events import Event, make_event
from streams.outcomes import Outcome
from streams.payloads import (
    GroupFormed,
    Limits,
    Payload,
    RolloutRequested,
    SandboxReady,
    StepTimes,
    TrainerStep,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
    WeightsPublished,
)
from streams.settings import PolicySettings

RUN = "run-live"
S = 1_000_000_000


def _event(data: Payload, seq: int, *, tid: str = "", run: str = RUN, at_s: float = 0.0) -> Event:
    return make_event(
        data,
        run_id=run,
        seq=seq,
        time_ns=int(at_s * S),
        source="test",
        group_id="g0",
        trajectory_id=tid or None,
        id_key=f"{run}:{tid}:{type(data).__name__}",
    )


def _finished(outcome: Outcome) -> TrajectoryFinished:
    reward = None if outcome.is_infra_error else float(outcome == Outcome.RESOLVED)
    return TrajectoryFinished(
        outcome=outcome, reward=reward, turns=3, generated_tokens=10, context_tokens=20, last_seq=9
    )


def _turn(queue_wait_s: float) -> TurnGenerated:
    return TurnGenerated(
        turn=1,
        observation_token_ids=[1],
        output_token_ids=[2, 3],
        output_logprobs=[-0.1, -0.2],
        output_versions=[0, 0],
        finish_reason="stop",
        engine_id="e0",
        weight_version=0,
        context_tokens=3,
        queue_wait_s=queue_wait_s,
        latency_s=0.1,
    )


def _ready(queue_wait_s: float) -> SandboxReady:
    return SandboxReady(backend="bwrap", sandbox_id="b", queue_wait_s=queue_wait_s, start_s=0.1)


def _step(step: int) -> TrainerStep:
    return TrainerStep(
        step=step,
        version=step,
        groups=1,
        trajectories=4,
        loss=0.1,
        grad_norm=0.07,
        mean_logprob_diff=0.011,
        ess=0.93,
        reward_mean=0.25,
    )


def run_events() -> list[Event]:
    """A small run: 4 requests, 3 started, outcomes of 3 kinds, 2 groups, a step and a version."""
    started = TrajectoryStarted(attempt=0, group_size=4, limits=Limits())
    events = [
        _event(RolloutRequested(task_dir="t", attempt=i, group_size=4), 0, tid=f"t{i}", at_s=0.0)
        for i in range(4)
    ]
    events += [_event(started, 0, tid=f"t{i}", at_s=float(i)) for i in range(3)]  # slot waits 0, 1, 2 s
    events += [
        _event(SandboxReady(backend="bwrap", sandbox_id="b", queue_wait_s=0.5, start_s=0.1), 1, tid="t0")
    ]
    events += [_event(_turn(0.25), 2, tid="t0"), _event(_turn(0.25), 3, tid="t1")]
    outcomes = {"t0": Outcome.RESOLVED, "t1": Outcome.TRUNCATED_TURNS, "t2": Outcome.INFRA_SANDBOX_START}
    events += [_event(_finished(o), 9, tid=t) for t, o in outcomes.items()]
    group = {
        "members": ["t0", "t1"],
        "rewards": [1.0, 0.0],
        "advantages": [1.0, -1.0],
        "policy": PolicySettings(),
    }
    events += [_event(GroupFormed(**group), 0), _event(GroupFormed(**group, dropped="zero_variance"), 1)]
    events[-1] = events[-1].model_copy(update={"group_id": "g1"})
    events += [_event(_step(1), 1), _event(WeightsPublished(version=1, path="/w/1", step=1), 1)]
    return events


def test_the_fold_counts_a_run_once_whatever_is_read_twice_or_belongs_elsewhere() -> None:
    view = RunView(RUN, slots=3)
    events = run_events()
    other = _event(_finished(Outcome.RESOLVED), 9, tid="x", run="another-run")
    for event in [*events, other, *events]:  # every event read twice, one of another run
        view.apply(event)
    assert len(view.requested) == 4 and view.queued == 1
    assert view.in_flight == 0 and len(view.finished) == 3
    assert view.outcomes() == {"resolved": 1, "truncated:turns": 1, "infra_error:sandbox_start": 1}
    assert view.kept == 1 and view.dropped() == {"zero_variance": 1}
    assert [(r.step, r.reward_mean, r.ess) for r in view.recent_steps(5)] == [(1, 0.25, 0.93)]
    assert view.versions == {1: 1}
    assert view.waits["rollout slots"].total_s == 3.0 and view.waits["rollout slots"].count == 3
    assert view.binding_cap() == "rollout slots"  # 3 s waiting for slots vs 1 s sandbox, 1 s engine


def test_the_screen_says_what_the_trainer_waited_for() -> None:
    """Before a step: what there is to train on. Steps that waited 60% of their time for groups while
    all 4 slots ran rollouts: the slots bind; the same waits with the machine's CPU 95% busy: the
    CPU the rollouts share binds."""
    before = RunView(RUN, slots=4)
    for event in run_events():
        if not isinstance(event.data, TrainerStep):
            before.apply(event)
    console = Console(width=400, record=True)
    console.print(render_run(before))
    assert "trainer: no step yet; groups kept 1, dropped 1 zero_variance" in console.export_text()

    started = TrajectoryStarted(attempt=0, group_size=4, limits=Limits())
    running = [_event(started, 0, tid=f"t{i}") for i in range(4)]  # never finish here
    for cpu, says in (
        (0.4, "every rollout slot busy (4.0 rollouts in flight of 4 slots)"),
        (0.95, "CPU 95% busy"),
    ):
        times = StepTimes(
            wait_s=6.0, wait_groups_s=5.5, wait_trajectories_s=0.2, wait_cpu_busy=cpu, total_s=10.0
        )
        steps = [_event(_step(i).model_copy(update={"times": times}), i, at_s=10.0 * i + 10) for i in (1, 2)]
        view = RunView(RUN, slots=4)
        for event in running + steps:
            view.apply(event)
        console = Console(width=400, record=True)
        console.print(render_run(view))
        text = console.export_text()
        assert "the trainer waited 60% of its step time, mostly for groups not formed yet" in text
        assert says in text, text
        assert f"6.0s: groups 5.5, traj 0.2, cpu {cpu:.0%}" in text


def test_the_binding_cap_follows_where_the_waiting_is() -> None:
    view = RunView(RUN)
    assert view.binding_cap() is None
    view.apply(
        _event(SandboxReady(backend="bwrap", sandbox_id="b", queue_wait_s=4.0, start_s=0.1), 1, tid="a")
    )
    view.apply(_event(_turn(1.0), 2, tid="a"))
    assert view.binding_cap() == "sandbox pool"
    for seq in range(3, 8):
        view.apply(_event(_turn(1.0), seq, tid="a"))
    assert view.binding_cap() == "engine queue"
    named = SandboxReady(
        backend="bwrap",
        sandbox_id="c",
        queue_wait_s=9.0,
        start_s=0.1,
        cap_waits={"running": 8.0, "start_rate": 0.5},
    )
    view.apply(_event(named, 1, tid="b"))
    assert view.binding_cap() == "sandbox running"  # the pool's own cap, named on the event
    assert view.waits["sandbox start_rate"].total_s == 0.5 and view.waits["sandbox pool"].total_s == 4.0


def test_the_screen_shows_every_part_of_the_run() -> None:
    view = RunView(RUN, slots=3)
    for event in run_events():
        view.apply(event)
    status = ProcessStatus("rollout", 123, State.RUNNING, 2, -9, 0.4, 30.0, "exited with code -9")
    console = Console(width=200, record=True)
    console.print(render_run(view, [status]))
    text = console.export_text()
    for expected in (
        "truncated:turns",
        "infra_error:sandbox_start",
        "dropped: zero_variance",
        "0.930",
        "0.0110",
        "binding cap rollout slots",
        "exited with code -9",
        "rollout",
    ):
        assert expected in text, expected


def test_the_follower_reads_the_runs_topics_from_the_broker(kafka_config: Config) -> None:
    events = run_events()
    now = time.time_ns()
    topic_of = {
        "rollout.requested": "rollout.requests",
        "group.formed": "groups",
        "trainer.step": "trainer.steps",
        "weights.published": "weights.history",
    }

    async def scenario() -> RunView:
        view = RunView(RUN, slots=3)
        follower = RunFollower(kafka_config.kafka, kafka_config.topics, view, kafka_config.live, since_ns=now)
        stop = asyncio.Event()
        task = asyncio.create_task(follower.run(stop))
        async with EventProducer(kafka_config.kafka, kafka_config.topics) as producer:
            for event in events:
                timed = event.model_copy(update={"time_ns": now + event.time_ns})
                await producer.send(topic_of.get(event.type, "rollout.events"), timed)
            await producer.flush()
        deadline = time.monotonic() + 30
        while view.events < len(events) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        stop.set()
        await task
        return view

    view = asyncio.run(scenario())
    assert view.events == len(events)
    assert len(view.finished) == 3 and view.kept == 1 and len(view.steps) == 1
