"""The docker backend behind the sandbox pool: warm sandboxes take their workspace on
handoff, and every container the pool started is gone after it closes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

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
