"""The engine client: least-outstanding routing, explicit caps, retries, error kinds."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from agents.engine.client import EngineClient
from agents.engine.protocol import EngineError, SamplingParams
from agents.settings import ClientSettings
from tests.engine.conftest import EngineFactory
from tests.engine.test_server import serving, wait_for

PARAMS = SamplingParams(max_new_tokens=6, seed=3)


def client(*urls: str, **overrides: object) -> EngineClient:
    settings = {"urls": urls, "retries": 2, "retry_backoff_s": 0.01, "timeout_s": 120.0, **overrides}
    return EngineClient(ClientSettings(**settings))


@asynccontextmanager
async def failing_server(seen: list[str], hang_s: float = 0.0) -> AsyncIterator[str]:
    """An HTTP server whose /generate always answers 500, or nothing for `hang_s` seconds
    first (records the rids it was sent)."""

    async def generate(request: web.Request) -> web.Response:
        seen.append((await request.json())["rid"])
        await asyncio.sleep(hang_s)
        return web.Response(status=500, text="CUDA error: an illegal memory access was encountered")

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_requests_spread_across_two_engines(make_engine: EngineFactory) -> None:
    async with serving(make_engine()) as one, serving(make_engine()) as two, client(one, two) as engines:
        results = await asyncio.gather(
            *(engines.generate(list(range(3, 13)), PARAMS, f"r{i}") for i in range(16))
        )
        metrics = engines.metrics()
    assert {r.engine_id for r in results} == {one, two}
    assert min(metrics.requests.values()) >= 4
    assert metrics.in_flight == {one: 0, two: 0}
    assert all(len(r.output_ids) == 6 and r.finish_reason == "length" for r in results)
    assert all(r.output_logprobs and r.output_versions == (0,) * 6 for r in results)


async def test_5xx_is_retried_with_the_same_rid_then_an_engine_error() -> None:
    seen: list[str] = []
    async with failing_server(seen) as url, client(url) as engines:
        with pytest.raises(EngineError) as caught:
            await engines.generate([5, 6, 7], PARAMS, "rid-1")
    assert caught.value.kind == "engine" and "HTTP 500" in caught.value.message
    assert seen == ["rid-1"] * 3
    assert engines.metrics().retries == 2


async def test_a_timeout_is_an_engine_error_retried_with_the_same_rid() -> None:
    seen: list[str] = []
    async with failing_server(seen, hang_s=3) as url, client(url, timeout_s=0.5, retries=1) as engines:
        with pytest.raises(EngineError) as caught:
            await engines.generate([5, 6, 7], PARAMS, "slow")
    assert caught.value.kind == "engine" and "no answer within 0.5s" in caught.value.message
    assert seen == ["slow", "slow"]


async def test_a_failing_engine_is_avoided_on_retry(make_engine: EngineFactory) -> None:
    seen: list[str] = []
    async with failing_server(seen) as bad, serving(make_engine()) as good, client(bad, good) as engines:
        results = await asyncio.gather(*(engines.generate([5, 6, 7], PARAMS, f"r{i}") for i in range(6)))
    assert all(r.engine_id == good for r in results)
    assert seen, "some requests were routed to the failing engine first"


async def test_connection_refused_is_a_network_error_after_retries() -> None:
    async with client(closed_port_url(), retries=1) as engines:
        with pytest.raises(EngineError) as caught:
            await engines.generate([5, 6, 7], PARAMS, "rid-2")
    assert caught.value.kind == "network"
    assert engines.metrics().errors == {"network": 2}


async def test_context_refusal_is_its_own_kind_and_not_retried(make_engine: EngineFactory) -> None:
    async with serving(make_engine(context_length=16)) as url, client(url) as engines:
        with pytest.raises(EngineError) as caught:
            await engines.generate(list(range(3, 23)), PARAMS, "too-long")
    assert caught.value.kind == "context" and not caught.value.retryable
    assert engines.metrics().requests == {url: 1}


async def test_in_flight_cap_is_explicit_and_its_waits_are_counted(make_engine: EngineFactory) -> None:
    async with serving(make_engine()) as url, client(url, max_in_flight=1) as engines:
        await asyncio.gather(*(engines.generate([5, 6, 7], PARAMS, f"c{i}") for i in range(3)))
        assert engines.metrics().in_flight_cap_waits == 2


async def test_cancelling_generate_aborts_on_the_engine(make_engine: EngineFactory) -> None:
    engine = make_engine()
    long = SamplingParams(max_new_tokens=3000, seed=1)
    async with serving(engine) as url, client(url) as engines:
        task = asyncio.create_task(engines.generate([5, 6, 7], long, "cancel-me"))
        await wait_for(lambda: engine.stats().running == 1, "the request to run")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for(lambda: engine.stats().running == 0 and engine.stats().queued == 0, "the abort")


async def test_no_hidden_cap_150_requests_reach_the_engine_at_once(make_engine: EngineFactory) -> None:
    engine = make_engine()
    engine.pause()
    async with serving(engine) as url, client(url) as engines:
        short = SamplingParams(max_new_tokens=2, seed=1)
        tasks = [asyncio.create_task(engines.generate([5, 6, 7], short, f"many{i}")) for i in range(150)]
        await wait_for(lambda: engine.stats().queued == 150, "150 requests queued on the engine")
        assert engines.metrics().in_flight == {url: 150}
        engine.resume()
        results = await asyncio.gather(*tasks)
    assert len(results) == 150 and engines.metrics().in_flight_cap_waits == 0
