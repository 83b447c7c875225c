"""The docker backend behind the sandbox pool: warm sandboxes take their workspace on
handoff, every container the pool started is gone after it closes, image pulls go
through the pool's hourly gate, once per image however many starts wait on it, and
`bench sandbox` counts failed starts as figures instead of dying on the first."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

from bench.sandbox import BenchPlan, ExecSamples, Measured, figures, start_latencies, write_repo
from sandboxes.base import SandboxError, SandboxStartError, SandboxTimeoutError
from sandboxes.docker import DockerSandboxFactory
from sandboxes.docker_api import DockerApi
from sandboxes.pool import SandboxPool


async def test_pool_hands_out_warm_docker_sandboxes_with_their_workspace(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi, tmp_path: Path
) -> None:
    factory = make_factory(pool={"warm_pool": 1, "max_running": 4})
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "answer.txt").write_text("forty-two\n")
    run_label = [f"rollstream.sandbox.run={factory.run_id}"]
    async with SandboxPool(factory.settings, factory) as pool:
        deadline = time.monotonic() + 120
        while not await raw_api.list_containers(run_label) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # the warm sandbox is being started ahead
        for _ in range(2):
            async with pool.sandbox(tmp_path / "repo") as box:
                result = await box.exec("cat answer.txt && ls -A | wc -l")
                assert result.stdout == "forty-two\n1\n"
                await box.exec("echo scratch > mine.txt")  # must not leak into the next sandbox
    deadline = time.monotonic() + 60
    while await raw_api.list_containers(run_label) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert await raw_api.list_containers(run_label) == []


async def test_pool_gates_image_pulls_and_concurrent_starts_pull_once(
    make_factory: Callable[..., DockerSandboxFactory],
) -> None:
    factory = make_factory(
        docker={"image": "rollstream-missing:gated"},  # no registry answers: every pull fails
        pool={"image_pulls_per_h": 1, "start_timeout_s": 3.0},
    )
    async with SandboxPool(factory.settings, factory) as pool:

        async def start() -> BaseException | None:
            try:
                async with pool.sandbox(None):
                    return None
            except SandboxError as error:
                return error

        first = await asyncio.gather(*(start() for _ in range(3)))
        assert all(isinstance(error, SandboxStartError) for error in first)
        assert factory.pulls == 1  # three starts at once, one pull (the others waited for it)
        blocked = await start()  # the hour's only pull is spent: the pool's gate holds the next
        assert isinstance(blocked, SandboxTimeoutError) and factory.pulls == 1


async def test_bench_counts_failed_starts_as_figures(
    make_factory: Callable[..., DockerSandboxFactory], tmp_path: Path
) -> None:
    factory = make_factory(docker={"image": "rollstream-missing:bench", "pull_missing": False})
    good = make_factory(pool={"max_running": 8})
    plan = BenchPlan(n=3, concurrency=3, warm=0, hold_s=0.0, exec_n=1)
    repo = write_repo(tmp_path)
    failed, _ = await start_latencies(factory.settings, factory, repo, plan, lambda: None)
    started, _ = await start_latencies(good.settings, good, repo, plan, lambda: None)
    assert failed.latencies == [] and dict(failed.failures.kinds) == {"sandbox_start": 3}
    assert "pull_missing" in failed.failures.examples["sandbox_start"]
    assert len(started.latencies) == 3 and started.failures.count == 0 and started.attempts == [1, 1, 1]

    report = figures("docker", plan, Measured(cold=failed, warm=started, execs=ExecSamples()))
    assert report["failures"] == 3 and report["failure_kinds"] == {"sandbox_start": 3}
    assert report["failures_by_phase"] == {"exec": 0, "cold_start": 3, "warm_handoff": 0}
    assert report["cold_start_p50_s"] is None and report["exec_median_s"] is None
    assert isinstance(report["start_p50_s"], float) and report["retried_starts"] == 0
