"""Evaluation: pass@1 as the reference run reports it, through real sandboxes and real Kafka, with
infrastructure errors re-run and never counted as failures."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.chat import ChatFormat
from agents.evaluate import AttemptResult, EvalInfraError, evaluate, pass_at_1
from agents.event_sink import KafkaEventSink
from agents.expert import ExpertPolicy
from agents.submit import limits_of
from rollstream.config import Config
from rollstream.rollout_services import episode_services
from sandboxes.backends import make_factory
from sandboxes.pool import SandboxPool
from sandboxes.tasks.family import write_family
from streams.bus import EventProducer, read_topic
from streams.payloads import TrajectoryFinished
from streams.topics import create_topics
from trainer.checkpoint import init_model_dir

pytestmark = pytest.mark.timeout(300)


def test_pass_at_1_is_the_mean_over_tasks_of_the_per_attempt_success() -> None:
    results = [
        AttemptResult("a", 0, True, "resolved", 0),
        AttemptResult("a", 1, False, "unresolved", 0),
        AttemptResult("b", 0, True, "resolved", 2),
        AttemptResult("b", 1, True, "resolved", 0),
    ]
    assert pass_at_1(results) == pytest.approx((0.5 + 1.0) / 2)
    assert pass_at_1([]) == 0.0


async def _evaluate(cfg: Config, tasks_dir: Path, model: Path, run: str, reruns: int) -> object:
    chat = ChatFormat.from_model_dir(model)
    policy = ExpertPolicy(chat, cfg.expert, cfg.agent)
    await create_topics(cfg.kafka, cfg.topics)
    tasks = write_family(tasks_dir, "heldout", 4, 2)
    async with (
        SandboxPool(cfg.sandbox, make_factory(cfg.sandbox)) as pool,
        EventProducer(cfg.kafka, cfg.topics) as producer,
    ):
        return await evaluate(
            run,
            tasks,
            3,
            services=episode_services(cfg, policy, pool, chat),
            sink=KafkaEventSink(producer),
            limits=limits_of(cfg.policy),
            concurrency=4,
            max_infra_reruns=reruns,
            model_version=7,
        )


def test_infra_errors_are_rerun_and_never_count_as_failures(
    config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    # An expert that always reads the tests and always picks the right fix resolves every attempt, so
    # pass@1 stays 1.0 exactly when no injected sandbox failure is counted as a failure.
    cfg = config_factory(
        "expert.test_first_rate=1.0",
        "expert.right_edit_rate=1.0",
        "sandbox.faults.start_failure_rate=0.3",
        "sandbox.faults.seed=5",
        "sandbox.pool.warm_pool=0",
        "policy.max_turns=4",
    )
    model = tmp_path / "model"
    init_model_dir(cfg.model, model)
    result = asyncio.run(_evaluate(cfg, tmp_path / "tasks", model, "eval-test", reruns=10))
    assert result.pass1 == 1.0 and result.tasks == 4 and result.attempts == 3  # type: ignore[attr-defined]
    assert result.infra_reruns > 0  # type: ignore[attr-defined]  # faults were injected and re-run

    finished = [
        c.event
        for c in asyncio.run(read_topic(cfg.kafka, cfg.topics, "rollout.events"))
        if c.event.type == "trajectory.finished" and c.event.run_id == "eval-test"
    ]
    outcomes = collections.Counter(str(e.data.outcome) for e in finished)  # type: ignore[union-attr]
    assert outcomes["resolved"] == 12  # every (task, attempt) once, as events under the eval's run id
    infra = [
        e.data for e in finished if isinstance(e.data, TrajectoryFinished) and e.data.outcome.is_infra_error
    ]
    assert len(infra) == result.infra_reruns and all(d.injected and d.reward is None for d in infra)  # type: ignore[attr-defined]


def test_an_attempt_that_never_runs_clean_is_an_error_not_a_score(
    config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    cfg = config_factory("sandbox.faults.start_failure_rate=1.0", "sandbox.pool.warm_pool=0")
    model = tmp_path / "model"
    init_model_dir(cfg.model, model)
    with pytest.raises(EvalInfraError, match="fix the infrastructure"):
        asyncio.run(_evaluate(cfg, tmp_path / "tasks", model, "eval-broken", reruns=1))
