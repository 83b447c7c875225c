"""The sandbox pool: caps bind and their waits are recorded; failures and hangs are infra errors.

The injected failures use a test factory (`ScriptedFactory`) whose sandboxes fail
or hang in `start()`; the warm pool and the "still serves" checks use real bwrap.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from sandboxes.base import ExecResult, SandboxStartError, SandboxTimeoutError, Timings
from sandboxes.bwrap import BwrapSandboxFactory
from sandboxes.pool import SandboxPool
from sandboxes.settings import PoolSettings, SandboxSettings

pytestmark = pytest.mark.timeout(120)


class ScriptedSandbox:
    backend = "scripted"

    def __init__(self, factory: ScriptedFactory, number: int) -> None:
        self.id = f"scripted-{number}"
        self.timings = Timings()
        self._factory = factory
        self._number = number

    async def start(self) -> None:
        behaviour = self._factory.behaviour(self._number)
        if behaviour == "fail":
            raise RuntimeError("injected start failure")
        if behaviour == "hang":
            await asyncio.sleep(3600)
        await asyncio.sleep(self._factory.start_s)
        self._factory.alive += 1
        self._factory.peak = max(self._factory.peak, self._factory.alive)

    async def exec(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        return ExecResult(exit_code=0, stdout=command, stderr="", duration_s=0.0)

    async def upload(self, local: Path, remote: str) -> None:
        return None

    async def download(self, remote: str, local: Path) -> None:
        return None

    async def stop(self) -> None:
        self._factory.stopped += 1
        if self._factory.behaviour(self._number) == "ok":
            self._factory.alive -= 1


class ScriptedFactory:
    """Sandboxes whose start succeeds after `start_s`, or fails / hangs for the numbers listed."""

    backend = "scripted"

    def __init__(
        self, start_s: float = 0.0, failing: set[int] = frozenset(), hanging: set[int] = frozenset()
    ):
        self.start_s, self.failing, self.hanging = start_s, failing, hanging
        self.created = self.alive = self.peak = self.stopped = 0

    def behaviour(self, number: int) -> str:
        return "fail" if number in self.failing else "hang" if number in self.hanging else "ok"

    def create(self, workspace: Path | None) -> ScriptedSandbox:
        self.created += 1
        return ScriptedSandbox(self, self.created - 1)


def pool_settings(**caps: object) -> SandboxSettings:
    return SandboxSettings(pool=PoolSettings(**{"start_timeout_s": 30.0, **caps}))


async def use(pool: SandboxPool, hold_s: float = 0.0) -> str:
    async with pool.sandbox(None) as box:
        await asyncio.sleep(hold_s)
        return (await box.exec("ok")).stdout


async def test_running_cap_binds_and_its_waits_are_recorded() -> None:
    factory = ScriptedFactory()
    pool = SandboxPool(pool_settings(max_running=2), factory)
    results = await asyncio.gather(*(use(pool, hold_s=0.2) for _ in range(6)))
    assert results == ["ok"] * 6
    assert factory.peak == 2
    waits = pool.cap_wait_stats()["running"]
    assert waits.count >= 4 and waits.total_s > 0 and waits.max_s > 0
    assert pool.cap_waits()["running"] == waits.total_s
    assert pool.stats().running == 0 and factory.stopped == 6


async def test_starting_cap_and_start_rate_bind() -> None:
    factory = ScriptedFactory(start_s=0.2)
    pool = SandboxPool(pool_settings(max_starting=1), factory)
    await asyncio.gather(*(use(pool) for _ in range(4)))
    assert pool.cap_wait_stats()["starting"].count >= 2

    rated = SandboxPool(pool_settings(starts_per_s=10.0), ScriptedFactory())
    await asyncio.gather(*(use(rated) for _ in range(5)))
    rate = rated.cap_wait_stats()["start_rate"]
    assert rate.count >= 2 and rate.total_s >= 0.3  # 5 starts at once, 0.1 s apart: 1.0 s in all


async def test_image_pull_cap_blocks_once_spent() -> None:
    pool = SandboxPool(pool_settings(image_pulls_per_h=1), ScriptedFactory())
    await asyncio.wait_for(pool.image_pull(), 5)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(pool.image_pull(), 0.3)


async def test_injected_start_failure_is_an_infra_error_and_the_pool_recovers() -> None:
    factory = ScriptedFactory(failing={0})
    pool = SandboxPool(pool_settings(max_running=1), factory)
    with pytest.raises(SandboxStartError, match="injected start failure") as caught:
        await use(pool)
    assert caught.value.kind == "sandbox_start"
    assert await use(pool) == "ok"
    assert pool.stats().failed == 1 and pool.stats().started == 1 and pool.stats().running == 0


async def test_injected_start_hang_is_a_timeout_and_the_pool_recovers() -> None:
    factory = ScriptedFactory(hanging={0})
    pool = SandboxPool(pool_settings(max_running=1, start_timeout_s=0.5), factory)
    with pytest.raises(SandboxTimeoutError) as caught:
        await use(pool)
    assert caught.value.kind == "timeout"
    assert factory.stopped == 1, "the hung sandbox is stopped"
    assert await use(pool) == "ok"
    assert pool.stats().failed == 1 and pool.stats().running == 0


async def test_warm_pool_hands_out_started_bwrap_sandboxes(
    settings: SandboxSettings, factory: BwrapSandboxFactory, repo: Path
) -> None:
    warm = settings.model_copy(update={"pool": settings.pool.model_copy(update={"warm_pool": 2})})
    async with SandboxPool(warm, factory) as pool:
        await wait_until(lambda: pool.stats().warm == 2)
        async with pool.sandbox(repo) as box:
            assert box.timings.warm
            result = await box.exec("cat pkg/__init__.py && id -u")
        assert result.stdout.startswith("VALUE = 1\n"), result
        await wait_until(lambda: pool.stats().warm == 2)
        stats = pool.stats()
        assert stats.warm_handoffs == 1 and stats.cold_starts == 0 and stats.running == 2
    assert pool.stats().running == 0 and pool.stats().warm == 0


async def wait_until(condition: object, timeout_s: float = 60.0) -> None:
    assert callable(condition)
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_closing_with_starts_in_flight_leaves_no_sandbox_behind(
    settings: SandboxSettings, factory: BwrapSandboxFactory
) -> None:
    caps = settings.pool.model_copy(update={"warm_pool": 6, "warm_starting": 6})
    warm = settings.model_copy(update={"pool": caps})
    for delay_s in (0.0, 0.02, 0.2):
        pool = SandboxPool(warm, factory)
        await pool.__aenter__()
        await asyncio.sleep(delay_s)  # close while starts are in flight
        await asyncio.wait_for(pool.close(), 60)
        assert pool.stats().running == 0 and pool.stats().warm == 0
    await wait_until(lambda: not bwrap_children())


def bwrap_children() -> list[int]:
    """Live `bwrap` processes started by this test process."""
    me, found = str(os.getpid()), []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if stat[1] == me and stat[0] != "Z" and cmdline.startswith(b"bwrap"):
            found.append(int(name))
    return found
