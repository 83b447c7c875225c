"""The gateway over HTTP (aiohttp): OpenAI's routes in front of the sessions.

    POST /sessions/{id}/v1/chat/completions   the session in the URL (base_url .../sessions/{id}/v1)
    POST /v1/chat/completions                 the session in the X-Session-Id header, or by its key
    GET  /v1/models, /sessions/{id}/v1/models the served model
    GET  /metrics                             Prometheus text (`agents.gateway.metrics`)
    GET  /health

plus, for a standalone gateway (`rollstream gateway serve`), the session routes of
`agents.gateway.admin`. Errors are OpenAI's JSON with OpenAI's statuses
(`agents.gateway.errors`). `GatewayServer` runs the app in the caller's event loop (the
rollout worker's), on loopback unless configured otherwise.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from agents.gateway.errors import OpenAIError, bad_request
from agents.gateway.registry import SESSION_HEADER, Gateway
from agents.gateway.requests import parse_chat_request
from agents.gateway.responses import completion_body
from agents.gateway.sse import CompletionStream

GATEWAY_KEY: web.AppKey[Gateway] = web.AppKey("gateway", Gateway)


def error_response(gateway: Gateway, error: OpenAIError) -> web.Response:
    gateway.metrics.calls[str(error.status)] += 1
    return web.json_response(error.body(), status=error.status)


def bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


async def json_body(request: web.Request) -> Any:
    try:
        return await request.json()
    except ValueError:
        raise bad_request("the request body is not valid JSON") from None


async def chat_completions(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY_KEY]
    call_id, created = "chatcmpl-" + secrets.token_hex(12), int(time.time())
    try:
        session = gateway.find(
            request.match_info.get("sid") or request.headers.get(SESSION_HEADER), bearer(request)
        )
        asked = parse_chat_request(await json_body(request), gateway.model_name)
    except OpenAIError as error:
        return error_response(gateway, error)
    if not asked.stream:
        try:
            result = await session.call(asked)
        except OpenAIError as error:
            return error_response(gateway, error)
        gateway.metrics.calls["200"] += 1
        return web.json_response(completion_body(gateway.chat, asked, result, call_id, created))
    stream = CompletionStream(request, gateway.chat, asked, call_id, created)
    try:
        result = await session.call(asked, stream.on_tokens)
    except OpenAIError as error:
        gateway.metrics.calls[str(error.status)] += 1
        return await stream.fail(error)
    except ConnectionResetError:  # the client left mid-stream: the engine request is aborted already
        gateway.metrics.calls["499"] += 1
        return stream.response or web.Response(status=499)
    gateway.metrics.calls["200"] += 1
    return await stream.finish(result)


async def models(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    card = {"id": gateway.model_name, "object": "model", "created": 0, "owned_by": "rollstream"}
    return web.json_response({"object": "list", "data": [card]})


async def metrics(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY_KEY]
    text = gateway.metrics.exposition(gateway.open_sessions)
    return web.Response(text=text, content_type="text/plain")


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


def create_app(
    gateway: Gateway, add_routes: Callable[[web.Application], None] | None = None
) -> web.Application:
    app = web.Application(client_max_size=gateway.settings.max_request_mb * 1024 * 1024)
    app[GATEWAY_KEY] = gateway
    app.router.add_post("/sessions/{sid}/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/sessions/{sid}/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    if add_routes is not None:
        add_routes(app)
    return app


class GatewayServer:
    """`async with GatewayServer(gateway) as server:` serves it at `server.url` until the block ends."""

    def __init__(self, gateway: Gateway, add_routes: Callable[[web.Application], None] | None = None) -> None:
        self.gateway = gateway
        self.runner = web.AppRunner(create_app(gateway, add_routes), access_log=None)
        self.url = ""

    async def __aenter__(self) -> GatewayServer:
        await self.runner.setup()
        settings = self.gateway.settings
        site = web.TCPSite(self.runner, settings.host, settings.port)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.gateway.close_all()
        await self.runner.cleanup()

    def base_url(self, sid: str) -> str:
        """What an OpenAI client takes as its base URL for one session."""
        return f"{self.url}/sessions/{sid}/v1"
