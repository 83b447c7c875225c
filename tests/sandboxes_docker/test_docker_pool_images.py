"""The pool with docker sandboxes per image, and the engine's concurrency cap, through podman's
real API: an image asked for once is kept warm from then on (the least recently asked one
dropped past `warm_images`), and starts queueing on `sandbox.docker.engine_concurrency` show
as waits on the `container_engine` cap, in the pool's totals and on the request that waited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from sandboxes.docker import DockerSandboxFactory
from sandboxes.docker_api import DockerApi
from sandboxes.pool import SandboxPool
from sandboxes.warm import WarmShelves


async def wait_until(check: Callable[[], bool], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.1)


async def test_an_image_asked_for_is_kept_warm_and_the_oldest_dropped(
    make_factory: Callable[..., DockerSandboxFactory], no_python_image: str, raw_api: DockerApi
) -> None:
    factory = make_factory(pool={"warm_pool": 1, "warm_images": 1, "max_running": 8})
    label = [f"rollstream.sandbox.run={factory.run_id}"]

    async def images_running() -> list[str]:
        return sorted(c["Image"].split("/")[-1] for c in await raw_api.list_containers(label))

    async with SandboxPool(factory.settings, factory) as pool:
        await wait_until(lambda: pool.stats().warm == 1)  # the default image's
        async with pool.sandbox(None, image=no_python_image) as first:
            assert not first.timings.warm and first.image == no_python_image  # cold: never asked before
        await wait_until(lambda: pool.stats().warm == 2)
        async with pool.sandbox(None, image=no_python_image) as second:
            assert second.timings.warm  # kept warm from the first request on
            assert (await second.exec("command -v python3 || echo none")).stdout == "none\n"
        await wait_until(lambda: pool.stats().warm == 2)
        other = factory.settings.docker.image.replace(":latest", ":pool-test")  # the same image, another name
        repo, _, tag = other.partition(":")
        await raw_api.request(
            "POST", f"/images/{factory.settings.docker.image}/tag", params={"repo": repo, "tag": tag}
        )
        try:
            async with pool.sandbox(None, image=other) as third:
                assert (await third.exec("command -v python3")).exit_code == 0
            await wait_until(lambda: pool.stats().warm == 2)  # the default's and `other`'s: busybox dropped
            deadline = time.monotonic() + 60
            while no_python_image in " ".join(await images_running()) and time.monotonic() < deadline:
                await asyncio.sleep(0.2)
            assert no_python_image not in " ".join(await images_running())
        finally:
            await pool.close()
            await raw_api.request("DELETE", f"/images/{other}")
    assert await raw_api.list_containers(label) == []


async def test_starts_beyond_the_engine_cap_wait_and_say_so(
    make_factory: Callable[..., DockerSandboxFactory],
) -> None:
    factory = make_factory(docker={"engine_concurrency": 1}, pool={"max_running": 8})
    async with SandboxPool(factory.settings, factory) as pool:

        async def start() -> tuple[float, float]:
            async with pool.sandbox(None) as box:
                return box.timings.cap_waits.get("container_engine", 0.0), box.timings.queued_s

        waits = await asyncio.gather(*(start() for _ in range(3)))
    assert pool.cap_wait_stats()["container_engine"].count >= 2  # one start at a time: the others waited
    assert pool.cap_waits()["container_engine"] > 0
    waited = [(engine, queued) for engine, queued in waits if engine > 0]
    assert len(waited) >= 2  # on the requests' own events (sandbox.ready's cap_waits)...
    assert all(queued >= engine * 0.99 for engine, queued in waited)  # ...and as queue wait, not start time


def test_warm_shelves_share_the_refills_and_drop_the_least_recent_image() -> None:
    shelves = WarmShelves(per_image=2, max_images=1, max_starting=3)
    assert shelves.to_start() == [None, None]  # the default image only, until another is asked for
    assert shelves.asked("a") == []
    assert shelves.to_start() == ["a"]  # three refills in flight at most, all images together
    boxes = [object(), object()]
    assert shelves.started("a", boxes[0]) and shelves.to_start() == ["a"]
    assert shelves.take("a", lambda _box: True) is boxes[0]
    assert shelves.asked("b") == []  # "a" had no warm sandbox left to hand back
    assert not shelves.started("a", boxes[1])  # "a" is no longer kept: the caller stops it
    assert shelves.take("b", lambda _box: True) is None and shelves.count() == 0


async def test_closing_while_warm_starts_are_in_flight_leaves_no_container(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi
) -> None:
    factory = make_factory(pool={"warm_pool": 4, "max_running": 8})
    label = [f"rollstream.sandbox.run={factory.run_id}"]
    for delay_s in (0.05, 0.3, 0.6):  # cancelled before, during and after their containers exist
        pool = SandboxPool(factory.settings, factory)
        await pool.__aenter__()
        await asyncio.sleep(delay_s)
        await pool.close()
        assert await raw_api.list_containers(label) == [], delay_s  # gone when close returns, not later
