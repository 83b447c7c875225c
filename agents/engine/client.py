"""The engine client: one asyncio client for any number of engines (ours or SGLang servers).

- Routing: each request goes to the engine with the fewest outstanding requests from
  this client (ties round-robin); a retry avoids the engine that just failed when there
  is another.
- No hidden caps: the HTTP pool size (`max_connections`) and the number of requests in
  flight across engines (`max_in_flight`) are settings; time spent waiting on the
  in-flight cap is counted, so a cap that binds shows up in `metrics()`.
- Failures are `EngineError`s, never model answers: connection failures are kind
  "network", 5xx / timeouts / malformed answers kind "engine"; both are retried
  `retries` times with exponential backoff and the same rid (our engine joins a retry
  to the request still in flight under that rid). A 400 for input over the context cap
  is kind "context" and is not retried; other 4xx are kind "request".
- A cancelled `generate` aborts its request on the engine, so a cancelled episode does
  not keep generating.
- `generate_stream` yields the tokens as the engine samples them (`GenerationChunk`s), then
  the whole `Generation`. It is retried like `generate` only until its first token has
  arrived; a stream that breaks after that is an engine error (a restarted generation could
  sample other tokens than those already handed on). Closing or cancelling the iteration
  before its end aborts the request on the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp

from agents.engine.answers import error_from_status, parse_generation, request_bytes
from agents.engine.protocol import EngineError, Generation, GenerationChunk, SamplingParams
from agents.engine.stream_reader import StreamAccumulator, decode_event, sse_data
from agents.settings import ClientSettings

JSON = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class ClientMetrics:
    in_flight: dict[str, int]  # per engine URL
    requests: dict[str, int]  # attempts sent, per engine URL
    in_flight_cap_waits: int  # requests that had to wait for the in-flight cap
    in_flight_cap_wait_s: float  # total time spent waiting on it
    retries: int
    errors: dict[str, int]  # per EngineError kind


class EngineClient:
    """Use as `async with EngineClient(settings) as client:` (or call `close()`)."""

    def __init__(self, settings: ClientSettings) -> None:
        if not settings.urls:
            raise ValueError("client.urls is empty: give at least one engine URL")
        self.settings = settings
        self.urls = tuple(url.rstrip("/") for url in settings.urls)
        self._session: aiohttp.ClientSession | None = None
        self._cap = asyncio.Semaphore(settings.max_in_flight)
        self._in_flight: Counter[str] = Counter({url: 0 for url in self.urls})
        self._requests: Counter[str] = Counter()
        self._errors: Counter[str] = Counter()
        self._rid_engine: dict[str, str] = {}
        self._turn = itertools.count()
        self._cap_waits = 0
        self._cap_wait_s = 0.0
        self._retries = 0

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=self.settings.max_connections, limit_per_host=0)
            timeout = aiohttp.ClientTimeout(
                total=self.settings.timeout_s, sock_connect=self.settings.connect_timeout_s
            )
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout)
        return self._session

    def metrics(self) -> ClientMetrics:
        return ClientMetrics(
            in_flight=dict(self._in_flight),
            requests=dict(self._requests),
            in_flight_cap_waits=self._cap_waits,
            in_flight_cap_wait_s=self._cap_wait_s,
            retries=self._retries,
            errors=dict(self._errors),
        )

    def _pick(self, avoid: str | None) -> str:
        candidates = [url for url in self.urls if url != avoid] or list(self.urls)
        offset = next(self._turn)
        rotated = candidates[offset % len(candidates) :] + candidates[: offset % len(candidates)]
        return min(rotated, key=lambda url: self._in_flight[url])

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str) -> Generation:
        """Generate on the least-loaded engine; raises EngineError when every attempt failed."""
        async with self._in_flight_slot():
            return await self._generate_with_retries(input_ids, params, rid)

    @contextlib.asynccontextmanager
    async def _in_flight_slot(self) -> AsyncIterator[None]:
        if self._cap.locked():
            self._cap_waits += 1
        waited = time.monotonic()
        async with self._cap:
            self._cap_wait_s += time.monotonic() - waited
            yield

    async def generate_stream(
        self, input_ids: list[int], params: SamplingParams, rid: str
    ) -> AsyncIterator[GenerationChunk | Generation]:
        """The generation's tokens as they are sampled, then the whole `Generation` (see the module
        docstring for retries and aborts)."""
        async with self._in_flight_slot():
            failed: str | None = None
            for attempt in range(self.settings.retries + 1):
                url = self._pick(avoid=failed)
                started = False
                try:
                    async for item in self._stream_attempt(url, input_ids, params, rid):
                        started = True
                        yield item
                    return
                except EngineError as error:
                    self._errors[error.kind] += 1
                    if started or not error.retryable or attempt == self.settings.retries:
                        raise
                    failed = url
                    self._retries += 1
                    await asyncio.sleep(self.settings.retry_backoff_s * (2**attempt))

    async def _stream_attempt(
        self, url: str, input_ids: list[int], params: SamplingParams, rid: str
    ) -> AsyncIterator[GenerationChunk | Generation]:
        self._in_flight[url] += 1
        self._requests[url] += 1
        self._rid_engine[rid] = url
        finished = False
        try:
            body = request_bytes(input_ids, params, rid, stream=True)
            async with self._http().post(f"{url}/generate", data=body, headers=JSON) as reply:
                if reply.status != 200:
                    raise error_from_status(reply.status, await reply.text(), url)
                stream = StreamAccumulator(url, len(input_ids))
                async for data in sse_data(reply.content):
                    chunk, generation = stream.add(decode_event(data, url))
                    if chunk is not None:
                        yield chunk
                    if generation is not None:
                        finished = True
                        yield generation
                        return
            raise EngineError("engine", "the stream ended before the generation finished", engine_id=url)
        except aiohttp.ClientConnectionError as error:
            kind = "engine" if isinstance(error, aiohttp.SocketTimeoutError) else "network"
            raise EngineError(kind, f"{type(error).__name__}: {error}", engine_id=url) from None
        except TimeoutError:
            raise EngineError(
                "engine", f"no answer within {self.settings.timeout_s}s", engine_id=url
            ) from None
        except aiohttp.ClientPayloadError as error:
            raise EngineError("engine", f"unreadable stream: {error}", engine_id=url) from None
        finally:
            self._in_flight[url] -= 1
            self._rid_engine.pop(rid, None)
            if not finished:  # closed, cancelled or failed before the end: stop the engine generating
                await asyncio.shield(self._abort_on(url, rid))

    async def _generate_with_retries(
        self, input_ids: list[int], params: SamplingParams, rid: str
    ) -> Generation:
        failed: str | None = None
        for attempt in range(self.settings.retries + 1):
            url = self._pick(avoid=failed)
            try:
                return await self._attempt(url, input_ids, params, rid)
            except EngineError as error:
                self._errors[error.kind] += 1
                if not error.retryable or attempt == self.settings.retries:
                    raise
                failed = url
                self._retries += 1
                await asyncio.sleep(self.settings.retry_backoff_s * (2**attempt))
        raise AssertionError("unreachable: the last attempt raises")

    async def _attempt(self, url: str, input_ids: list[int], params: SamplingParams, rid: str) -> Generation:
        self._in_flight[url] += 1
        self._requests[url] += 1
        self._rid_engine[rid] = url
        try:
            body = request_bytes(input_ids, params, rid)
            async with self._http().post(f"{url}/generate", data=body, headers=JSON) as reply:
                if reply.status != 200:
                    raise error_from_status(reply.status, await reply.text(), url)
                payload = await reply.json(content_type=None)
            return parse_generation(payload, url, len(input_ids))
        except asyncio.CancelledError:
            await asyncio.shield(self._abort_on(url, rid))
            raise
        except aiohttp.ClientConnectionError as error:
            kind = "engine" if isinstance(error, aiohttp.SocketTimeoutError) else "network"
            raise EngineError(kind, f"{type(error).__name__}: {error}", engine_id=url) from None
        except TimeoutError:
            message = f"no answer within {self.settings.timeout_s}s"
            raise EngineError("engine", message, engine_id=url) from None
        except (aiohttp.ClientPayloadError, aiohttp.ContentTypeError, ValueError) as error:
            raise EngineError("engine", f"unreadable answer: {error}", engine_id=url) from None
        finally:
            self._in_flight[url] -= 1
            self._rid_engine.pop(rid, None)

    async def abort(self, rid: str) -> None:
        """Abort `rid` on the engine serving it (on every engine when unknown). Best effort."""
        url = self._rid_engine.get(rid)
        await asyncio.gather(*(self._abort_on(u, rid) for u in ([url] if url else self.urls)))

    async def _abort_on(self, url: str, rid: str) -> None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with self._http().post(f"{url}/abort_request", json={"rid": rid}) as reply:
                await reply.read()
