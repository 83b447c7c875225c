"""The docker backend behind the sandbox pool: warm sandboxes take their workspace on
handoff, every container the pool started is gone after it closes, and image pulls
go through the pool's hourly gate, once per image however many starts wait on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

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
