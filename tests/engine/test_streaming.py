"""The engine's streaming path and top-k logprobs, over real HTTP with the real client.

- a streamed generation is token for token the plain one (same seed), its first tokens
  reach the client while the engine is still generating, and it ends with the whole answer;
- top-k alternatives come sorted, from the sampling distribution (greedy: the sampled token
  is the first alternative, with its own logprob);
- a client that leaves mid-stream has its request aborted in the engine;
- SGLang's cumulative stream form is read as well as the incremental one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math

import aiohttp

from agents.engine.batch import EngineResult, TokenEvent, TokenListener
from agents.engine.client import EngineClient
from agents.engine.engine import Engine
from agents.engine.protocol import Generation, GenerationChunk, SamplingParams
from agents.engine.stream_reader import StreamAccumulator
from agents.settings import ClientSettings
from tests.engine.conftest import EngineFactory
from tests.engine.test_server import TIMEOUT, serving, wait_for


def hold_after_first_token(engine: Engine) -> None:
    """Make the engine pause itself, from its scheduler thread, once the first streamed token
    of the next streaming request is sampled (the streaming listener is wrapped, nothing else)."""
    submit = engine.submit

    def submit_holding(
        rid: str, input_ids: list[int], params: SamplingParams, listener: TokenListener | None = None
    ) -> concurrent.futures.Future[EngineResult]:
        if listener is None:
            return submit(rid, input_ids, params)
        inner = listener

        def pause_then_listen(event: TokenEvent) -> None:
            if event.index == 0:
                engine.pause()  # the scheduler finishes this step, then waits for resume
            inner(event)

        return submit(rid, input_ids, params, pause_then_listen)

    engine.submit = submit_holding  # type: ignore[method-assign]


def client(url: str) -> EngineClient:
    return EngineClient(ClientSettings(urls=(url,), retries=1, retry_backoff_s=0.01, timeout_s=120.0))


async def test_stream_is_the_plain_generation_and_arrives_while_generating(
    make_engine: EngineFactory,
) -> None:
    engine = make_engine()
    params = SamplingParams(max_new_tokens=64, seed=5, temperature=1.0)
    prompt = list(range(3, 40))
    async with serving(engine) as url, client(url) as engine_client:
        plain = await engine_client.generate(prompt, params, "plain")
        hold_after_first_token(engine)
        chunks: list[GenerationChunk] = []
        first_chunk = asyncio.Event()

        async def read_stream() -> Generation:
            async for item in engine_client.generate_stream(prompt, params, "streamed"):
                if isinstance(item, Generation):
                    return item
                chunks.append(item)
                first_chunk.set()
            raise AssertionError("the stream ended without its result")

        reader = asyncio.create_task(read_stream())
        # The engine holds itself right after the first streamed token: whatever reaches the
        # client while it is held was sent before the generation ended (polling from here would
        # race the scheduler thread on a loaded machine).
        await asyncio.wait_for(first_chunk.wait(), 60)
        # the chunk can arrive while the scheduler still finishes the step that paused it
        await wait_for(lambda: engine.stats().running == 1, "the held generation to sit in the decode batch")
        assert not reader.done(), "the generation ended while it was held"
        streamed_while_held = sum(len(c.output_ids) for c in chunks)
        engine.resume()
        final = await asyncio.wait_for(reader, 120)
    assert 0 < streamed_while_held < len(plain.output_ids)
    assert final.output_ids == plain.output_ids
    assert final.output_logprobs == plain.output_logprobs
    assert [t for c in chunks for t in c.output_ids] == list(plain.output_ids)
    assert len(chunks) > 1, "the answer came in one piece"


async def test_top_logprobs_are_the_sampling_distributions_alternatives(make_engine: EngineFactory) -> None:
    async with serving(make_engine()) as url, client(url) as engine_client:
        greedy = SamplingParams(max_new_tokens=8, temperature=0.0, top_logprobs=5)
        answer = await engine_client.generate(list(range(3, 20)), greedy, "top")
        items = [item async for item in engine_client.generate_stream(list(range(3, 20)), greedy, "top-s")]
        streamed = items[-1]
    assert isinstance(streamed, Generation)
    assert len(answer.output_top_logprobs) == len(answer.output_ids) == 8
    for token, logprob, alternatives in zip(
        answer.output_ids, answer.output_logprobs, answer.output_top_logprobs, strict=True
    ):
        assert len(alternatives) == 5
        assert alternatives[0] == (token, logprob)  # greedy: the sampled token is the most likely
        values = [lp for _, lp in alternatives]
        assert values == sorted(values, reverse=True)
        assert sum(math.exp(v) for v in values) <= 1.0 + 1e-5
    assert streamed.output_top_logprobs == answer.output_top_logprobs


async def test_a_client_leaving_mid_stream_aborts_its_request(make_engine: EngineFactory) -> None:
    engine = make_engine()
    body = {
        "input_ids": list(range(3, 30)),
        "sampling_params": {"max_new_tokens": 3000, "temperature": 1.0, "sampling_seed": 1},
        "rid": "leaver",
        "stream": True,
    }
    async with serving(engine) as url:
        async with (
            aiohttp.ClientSession(timeout=TIMEOUT) as http,
            http.post(f"{url}/generate", json=body) as reply,
        ):
            assert reply.status == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
            first = await reply.content.readuntil(b"\n\n")
            assert first.startswith(b"data: {")
        # the connection is closed: the engine stops generating for nobody
        await wait_for(lambda: engine.stats().running == 0, "the abandoned request to be aborted")
        assert engine.stats().generated_tokens < 3000


def test_cumulative_stream_events_are_read_like_incremental_ones() -> None:
    def event(ids: list[int], done: bool) -> dict[str, object]:
        meta = {
            "completion_tokens": len(ids),
            "weight_version": "3",
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
            "finish_reason": {"type": "stop", "matched": ids[-1]} if done else None,
            "prompt_tokens": 4,
        }
        return {"output_ids": ids, "meta_info": meta}

    stream = StreamAccumulator("sglang", 4)
    chunks = [stream.add(event(ids, ids == [5, 6, 7, 8])) for ids in ([5], [5, 6], [5, 6, 7, 8])]
    assert [c.output_ids for c, _ in chunks if c is not None] == [(5,), (6,), (7, 8)]
    final = chunks[-1][1]
    assert final is not None and final.output_ids == (5, 6, 7, 8) and final.weight_version == 3
    assert final.output_versions == (3, 3, 3, 3) and final.finish_reason == "stop"
