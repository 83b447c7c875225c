"""Fault injection in the real engine client (`client.faults`): a setting, not a test double.

`make_client(settings)` is the `EngineClient` of `settings`, or, when
`client.faults.engine_error_rate` is above 0, a `FaultyEngineClient`: the same client (routing,
caps, retries with the same rid, abort), except that an attempt drawn for a fault is answered
as an engine answering 5xx would be (`EngineError` kind "engine", HTTP 503) instead of being
sent. The client's own retry logic then runs as for a real 5xx, so a request fails only when
every attempt does, and the episode records it as `infra_error:engine` (never scored).

Counted in `injected`: `engine_error` per attempt answered 5xx, `request_failed` per request
whose last attempt was injected (what episodes record, `trajectory.finished.injected`). The
error raised then carries `injected=True`.

Draws are seeded (`client.faults.seed`) and keyed by (rid, attempt): rids are deterministic
per trajectory and turn (`agents.identity.request_id`), so a rerun of the same requests gets
the same faults whatever the order they run in.
"""

from __future__ import annotations

from collections import Counter

from agents.engine.client import EngineClient
from agents.engine.protocol import EngineError, Generation, SamplingParams
from agents.settings import ClientSettings
from sandboxes.faults import injects


class FaultyEngineClient(EngineClient):
    """An `EngineClient` whose attempts fail with an injected 5xx at `client.faults.engine_error_rate`."""

    def __init__(self, settings: ClientSettings) -> None:
        super().__init__(settings)
        self.injected: Counter[str] = Counter()
        self._attempts: Counter[str] = Counter()  # attempts so far per rid in flight

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str) -> Generation:
        try:
            return await super().generate(input_ids, params, rid)
        except EngineError as error:
            if error.injected:
                self.injected["request_failed"] += 1
            raise
        finally:
            self._attempts.pop(rid, None)

    async def _attempt(self, url: str, input_ids: list[int], params: SamplingParams, rid: str) -> Generation:
        attempt = self._attempts[rid]
        self._attempts[rid] += 1
        faults = self.settings.faults
        if not injects(faults.engine_error_rate, faults.seed, "engine_error", rid, attempt):
            return await super()._attempt(url, input_ids, params, rid)
        self.injected["engine_error"] += 1
        self._requests[url] += 1
        message = "HTTP 503: injected fault (client.faults.engine_error_rate)"
        raise EngineError("engine", message, engine_id=url, injected=True)


def make_client(settings: ClientSettings) -> EngineClient:
    """The engine client of `settings`, with `settings.faults` injected when a rate is set."""
    if settings.faults.engine_error_rate > 0:
        return FaultyEngineClient(settings)
    return EngineClient(settings)
