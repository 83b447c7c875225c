"""`client.faults.engine_error_rate` on the real client against the real embedded engine: rate 1
fails every attempt (retried with the same rid, then an injected engine error), rate 0 wraps
nothing, and a seeded rate fails the same requests again whatever order they run in."""

from __future__ import annotations

import asyncio

import pytest

from agents.engine.client import EngineClient
from agents.engine.faults import FaultyEngineClient, make_client
from agents.engine.protocol import EngineError, SamplingParams
from agents.settings import ClientFaultSettings, ClientSettings
from tests.engine.conftest import EngineFactory
from tests.engine.test_server import serving

PARAMS = SamplingParams(max_new_tokens=4, seed=3)


def settings(url: str, retries: int, **faults: float) -> ClientSettings:
    return ClientSettings(
        urls=(url,),
        retries=retries,
        retry_backoff_s=0.01,
        timeout_s=120.0,
        faults=ClientFaultSettings(**faults),
    )


async def failed_rids(client: EngineClient, rids: list[str]) -> set[str]:
    results = await asyncio.gather(
        *(client.generate([5, 6, 7], PARAMS, rid) for rid in rids), return_exceptions=True
    )
    for result in results:
        assert not isinstance(result, BaseException) or (isinstance(result, EngineError) and result.injected)
    return {rid for rid, result in zip(rids, results, strict=True) if isinstance(result, EngineError)}


async def test_rate_one_fails_every_attempt_as_an_injected_5xx(make_engine: EngineFactory) -> None:
    engine = make_engine()
    async with serving(engine) as url, make_client(settings(url, 2, engine_error_rate=1.0)) as client:
        assert isinstance(client, FaultyEngineClient)
        with pytest.raises(EngineError) as caught:
            await client.generate([5, 6, 7], PARAMS, "rid-1")
        metrics = client.metrics()
    assert caught.value.kind == "engine" and caught.value.injected and "HTTP 503" in caught.value.message
    assert client.injected == {"engine_error": 3, "request_failed": 1}  # 1 try + 2 retries, all injected
    assert metrics.retries == 2 and metrics.errors == {"engine": 3} and metrics.in_flight == {url: 0}


async def test_rate_zero_wraps_nothing(make_engine: EngineFactory) -> None:
    async with serving(make_engine()) as url, make_client(settings(url, 0)) as client:
        assert type(client) is EngineClient
        generation = await client.generate([5, 6, 7], PARAMS, "rid-0")
    assert len(generation.output_ids) == 4


async def test_a_seeded_rate_fails_the_same_requests_again(make_engine: EngineFactory) -> None:
    rids = [f"traj-{i}/turn-1" for i in range(12)]
    async with serving(make_engine()) as url:
        async with make_client(settings(url, 0, engine_error_rate=0.5, seed=5)) as client:
            first = await failed_rids(client, rids)
            assert isinstance(client, FaultyEngineClient)
            assert client.injected["request_failed"] == len(first)
        async with make_client(settings(url, 0, engine_error_rate=0.5, seed=5)) as client:
            again = await failed_rids(client, list(reversed(rids)))
        async with make_client(settings(url, 0, engine_error_rate=0.5, seed=6)) as client:
            other = await failed_rids(client, rids)
    assert first == again and 0 < len(first) < len(rids)
    assert other != first


async def test_a_retry_can_succeed_past_an_injected_error(make_engine: EngineFactory) -> None:
    async with (
        serving(make_engine()) as url,
        make_client(settings(url, 3, engine_error_rate=0.5, seed=1)) as client,
    ):
        failed = await failed_rids(client, [f"r{i}" for i in range(8)])
        injected = client.injected
    assert injected["engine_error"] > 0  # some attempts were failed, and retried with the same rid
    assert injected["request_failed"] == len(failed) < injected["engine_error"]
