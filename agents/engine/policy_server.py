"""Any `Policy` served over SGLang's /generate contract (plain and streaming), as an engine is.

A scripted policy (`agents.scripted.ScriptedPolicy`, `agents.expert.ExpertPolicy`) behind this
server is a model the real engine client, and so the session gateway, talks to over HTTP: the
path from an OpenAI call to the verifier's reward runs exactly as with a trained model.
Streams send one event per token, then the whole answer (`agents.engine.wire`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from agents.engine.batch import EngineResult
from agents.engine.protocol import EngineError, Generation
from agents.engine.server import error_response, parse_generate
from agents.engine.streaming import DONE, SSE_HEADERS, sse
from agents.engine.wire import generate_response
from agents.policy import Policy

POLICY_KEY: web.AppKey[Policy] = web.AppKey("policy", Policy)  # type: ignore[type-abstract]


def _result(rid: str, generation: Generation) -> EngineResult:
    g = generation
    return EngineResult(
        rid=rid,
        output_ids=g.output_ids,
        output_logprobs=g.output_logprobs,
        output_versions=g.output_versions,
        finish_reason=g.finish_reason,
        matched_token=g.output_ids[-1] if g.finish_reason == "stop" and g.output_ids else None,
        prompt_tokens=g.prompt_tokens,
        cached_tokens=g.cached_tokens,
        weight_version=g.weight_version,
        queue_wait_s=g.queue_wait_s,
        latency_s=g.latency_s,
        output_top_logprobs=g.output_top_logprobs,
    )


async def generate(request: web.Request) -> web.StreamResponse:
    try:
        asked = parse_generate(await request.json())
    except ValueError as error:
        return error_response(400, str(error), "invalid_request")
    try:
        generation = await request.app[POLICY_KEY].generate(asked.input_ids, asked.params, asked.rid)
    except EngineError as error:
        return error_response(400 if error.kind in ("request", "context") else 500, error.message, error.kind)
    result = _result(asked.rid, generation)
    if not asked.stream:
        return web.json_response(generate_response(result, asked.return_logprob, ""))
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    for index in range(len(result.output_ids)):
        event: dict[str, Any] = generate_response(result, asked.return_logprob, "", start=index)
        event["output_ids"] = event["output_ids"][:1]
        meta = event["meta_info"]
        meta.update(finish_reason=None, completion_tokens=index + 1)
        for key in ("output_token_logprobs", "output_top_logprobs", "output_token_versions"):
            if key in meta:
                meta[key] = meta[key][:1]
        await response.write(sse(event))
        await asyncio.sleep(0)
    await response.write(
        sse(generate_response(result, asked.return_logprob, "", start=len(result.output_ids)))
    )
    await response.write(DONE)
    return response


async def abort_request(request: web.Request) -> web.Response:
    body = await request.json() if request.can_read_body else {}
    if body.get("rid"):
        await request.app[POLICY_KEY].abort(str(body["rid"]))
    return web.Response(status=200)


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


def create_policy_app(policy: Policy) -> web.Application:
    app = web.Application()
    app[POLICY_KEY] = policy
    app.router.add_post("/generate", generate)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_get("/health", health)
    return app


@asynccontextmanager
async def serving_policy(policy: Policy, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve `policy` on a free port of `host` for the block's length; yields its URL."""
    runner = web.AppRunner(create_policy_app(policy), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    try:
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()
