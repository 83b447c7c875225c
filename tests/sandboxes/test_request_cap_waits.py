"""Each sandbox request knows which pool caps it waited on (`Timings.cap_waits`, carried by
`sandbox.ready`), while the pool's totals still count every wait; warm refills wait for no one."""

from __future__ import annotations

import asyncio

from sandboxes.pool import SandboxPool
from sandboxes.settings import PoolSettings, SandboxSettings
from sandboxes.simulated import SimulatedLatency, SimulatedSandboxFactory

FAST = SimulatedLatency(start_median_s=0.05, start_p99_s=0.06, time_scale=1.0)


def test_a_request_records_its_own_cap_waits() -> None:
    settings = SandboxSettings(backend="simulated", pool=PoolSettings(max_running=1, starts_per_s=0.0))

    async def scenario() -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        pool = SandboxPool(settings, SimulatedSandboxFactory(FAST))
        seen: dict[str, dict[str, float]] = {}

        async def request(name: str, hold_s: float) -> None:
            async with pool.sandbox(None) as box:
                seen[name] = dict(box.timings.cap_waits)
                await asyncio.sleep(hold_s)

        async with pool:
            first = asyncio.create_task(request("first", 0.4))
            await asyncio.sleep(0.1)  # the first holds the only running slot
            await asyncio.gather(first, request("second", 0.0))
        return seen["first"], seen["second"], pool.cap_waits()

    first, second, totals = asyncio.run(scenario())
    assert first == {}
    assert set(second) == {"running"} and second["running"] >= 0.2
    assert totals["running"] == second["running"]


def test_warm_refills_are_not_charged_to_the_request_that_started_them() -> None:
    caps = PoolSettings(max_running=4, warm_pool=1, starts_per_s=1.0)  # starts 1 s apart
    settings = SandboxSettings(backend="simulated", pool=caps)

    async def scenario() -> tuple[dict[str, float], float]:
        pool = SandboxPool(settings, SimulatedSandboxFactory(FAST))
        async with pool:
            await asyncio.sleep(0.3)  # the warm one is ready
            async with pool.sandbox(None) as box:  # a handoff, which starts a refill
                await asyncio.sleep(0.3)  # the refill waits on the start rate meanwhile
                return dict(box.timings.cap_waits), pool.cap_waits()["start_rate"]

    mine, rate_total = asyncio.run(scenario())
    assert rate_total > 0.3  # the refill did wait on the start rate...
    assert "start_rate" not in mine  # ...but not on behalf of the request that took the warm one
