"""The engine over real HTTP (aiohttp on a free port) with SGLang's request/response contract."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
from aiohttp import web

from agents.engine.engine import Engine
from agents.engine.server import create_app
from tests.engine.conftest import EngineFactory

TIMEOUT = aiohttp.ClientTimeout(total=120)


@asynccontextmanager
async def serving(engine: Engine) -> AsyncIterator[str]:
    """Serve `engine` on a free local port; yields the base URL."""
    runner = web.AppRunner(create_app(engine))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def wait_for(condition, what: str, timeout: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def body(rid: str, length: int = 8, **sampling: object) -> dict[str, object]:
    return {
        "input_ids": list(range(3, 3 + length)),
        "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "sampling_seed": 1, **sampling},
        "return_logprob": True,
        "rid": rid,
    }


async def test_generate_answers_in_sglang_shape(make_engine: EngineFactory) -> None:
    async with (
        serving(make_engine()) as url,
        aiohttp.ClientSession(timeout=TIMEOUT) as http,
        # What an SGLang client may send: nulls for defaults, options at their defaults.
        http.post(
            f"{url}/generate",
            json=body("a", stop_token_ids=None, top_k=None, ignore_eos=False, skip_special_tokens=True),
        ) as reply,
    ):
        assert reply.status == 200
        answer = await reply.json()
    meta = answer["meta_info"]
    assert len(answer["output_ids"]) == 6 and isinstance(answer["text"], str)
    assert meta["id"] == "a"
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["prompt_tokens"] == 8 and meta["completion_tokens"] == 6
    assert meta["weight_version"] == "0" and meta["output_token_versions"] == [0] * 6
    assert [entry[1] for entry in meta["output_token_logprobs"]] == answer["output_ids"]
    assert all(entry[0] < 0 and entry[2] is None for entry in meta["output_token_logprobs"])
    assert meta["e2e_latency"] >= meta["queue_time"] >= 0


async def test_refusals_are_400_with_a_message(make_engine: EngineFactory) -> None:
    async with serving(make_engine(context_length=32)) as url, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.post(f"{url}/generate", json=body("long", length=32)) as reply:
            assert reply.status == 400
            error = (await reply.json())["error"]
        assert error["type"] == "context_length_exceeded" and "context length (32 tokens)" in error["message"]
        async with http.post(f"{url}/generate", json=body("bad", logprob_mode="x")) as reply:
            assert reply.status == 400 and "unsupported sampling_params" in await reply.text()
        async with http.post(f"{url}/generate", json=body("bad", repetition_penalty=1.2)) as reply:
            assert reply.status == 400 and "only supported at their defaults" in await reply.text()
        async with http.post(f"{url}/generate", json={"text": "hello"}) as reply:
            assert reply.status == 400 and "input_ids" in await reply.text()
        async with http.post(f"{url}/generate", json=body("near", length=30, max_new_tokens=50)) as reply:
            clamped = await reply.json()
        assert clamped["meta_info"]["finish_reason"] == {"type": "length", "length": 2}


async def test_abort_request_returns_the_partial_output(make_engine: EngineFactory) -> None:
    engine = make_engine()
    async with serving(engine) as url, aiohttp.ClientSession(timeout=TIMEOUT) as http:

        async def generate(rid: str) -> dict:  # type: ignore[type-arg]
            async with http.post(f"{url}/generate", json=body(rid, max_new_tokens=3000)) as reply:
                return await reply.json()

        one, two, three = (asyncio.create_task(generate(rid)) for rid in ("one", "two", "three"))
        await wait_for(lambda: engine.stats().generated_tokens >= 6, "tokens")
        async with http.post(f"{url}/abort_request", json={"rid": "one"}) as reply:
            assert reply.status == 200
        first = await one
        assert first["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(first["output_ids"]) < 3000
        assert len(first["meta_info"]["output_token_logprobs"]) == len(first["output_ids"])
        async with http.post(f"{url}/abort_request", json={"abort_all": True}) as reply:
            assert reply.status == 200
        rest = await asyncio.gather(two, three)
        assert [r["meta_info"]["finish_reason"]["type"] for r in rest] == ["abort", "abort"]


async def test_pause_and_continue_generation(make_engine: EngineFactory) -> None:
    engine = make_engine()
    async with serving(engine) as url, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        async with http.post(f"{url}/pause_generation", json={"mode": "in_place"}) as reply:
            assert reply.status == 200
        task = asyncio.create_task(http.post(f"{url}/generate", json=body("held")))
        await wait_for(lambda: engine.stats().queued == 1, "the request to queue")
        await asyncio.sleep(0.2)
        assert not task.done() and engine.stats().generated_tokens == 0
        async with http.get(f"{url}/health_generate") as reply:
            assert reply.status == 200  # alive while paused
        async with http.post(f"{url}/continue_generation", json={}) as reply:
            assert reply.status == 200
        reply = await task
        assert (await reply.json())["meta_info"]["finish_reason"]["type"] == "length"
        reply.release()


async def test_update_weights_from_disk_and_info_routes(
    make_engine: EngineFactory, updated_model_dir: Path
) -> None:
    async with serving(make_engine()) as url, aiohttp.ClientSession(timeout=TIMEOUT) as http:
        update = {"model_path": str(updated_model_dir), "weight_version": "8"}
        async with http.post(f"{url}/update_weights_from_disk", json=update) as reply:
            result = await reply.json()
        assert result["success"] is True
        async with http.get(f"{url}/get_model_info") as reply:
            info = await reply.json()
        assert info["weight_version"] == "8" and info["model_path"] == str(updated_model_dir)
        assert info["is_generation"] is True
        async with http.post(f"{url}/generate", json=body("after")) as reply:
            meta = (await reply.json())["meta_info"]
        assert meta["weight_version"] == "8" and set(meta["output_token_versions"]) == {8}
        missing = {"model_path": str(updated_model_dir / "nope")}
        async with http.post(f"{url}/update_weights_from_disk", json=missing) as reply:
            failed = await reply.json()
        assert failed["success"] is False and "not found" in failed["message"]
        for method, route in (("GET", "/health_generate"), ("POST", "/flush_cache"), ("GET", "/health")):
            async with http.request(method, f"{url}{route}") as reply:
                assert reply.status == 200, route
