"""The gateway's sessions: opened by whoever owns a trajectory, found by id and key.

Each session gets an id and a separate key, both from `secrets` (unguessable); a call must
carry the session's key (`Authorization: Bearer <key>`, which is how OpenAI clients send
their API key), and the session is named by the URL (`/sessions/{id}/v1/...`), by the
`X-Session-Id` header, or by the key alone. A call with an unknown session is a 404, with a
key that is not that session's a 401 (the key of another session included), on an ended
session a 403 that says why: no call can reach a trajectory it was not given the key of.
Ended sessions are remembered (`gateway.ended_sessions_kept`) so late calls hear why.
"""

from __future__ import annotations

import asyncio
import hmac
import secrets
from collections import OrderedDict

from agents.chat import ChatFormat
from agents.gateway.errors import OpenAIError
from agents.gateway.generation import StreamingPolicy
from agents.gateway.metrics import GatewayMetrics
from agents.gateway.session import Emit, Session, SessionSpec
from agents.settings import GatewaySettings
from streams.outcomes import Outcome

SESSION_HEADER = "X-Session-Id"


class Gateway:
    """Sessions over one engine client and one chat format (the served model's)."""

    def __init__(
        self, chat: ChatFormat, policy: StreamingPolicy, settings: GatewaySettings, model_name: str
    ) -> None:
        self.chat = chat
        self.policy = policy
        self.settings = settings
        self.model_name = model_name
        self.metrics = GatewayMetrics()
        self._open: dict[str, Session] = {}
        self._ended: OrderedDict[str, Session] = OrderedDict()
        self._by_key: dict[str, str] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}

    @property
    def open_sessions(self) -> int:
        return len(self._open)

    def open(self, spec: SessionSpec, emit: Emit) -> Session:
        """A new session whose calls write through `emit`; it ends itself at `spec.timeout_s`."""
        sid = secrets.token_hex(16)
        session = Session(
            sid, "rsk-" + secrets.token_urlsafe(32), spec, self.chat, self.policy, emit, self.metrics
        )
        self._open[sid] = session
        self._by_key[session.key] = sid
        self.metrics.sessions_opened += 1
        loop = asyncio.get_running_loop()
        self._timers[sid] = loop.call_later(spec.timeout_s, self._expire, sid)
        return session

    def _expire(self, sid: str) -> None:
        session = self._open.get(sid)
        if session is not None:
            session.end(Outcome.TRUNCATED_TIME, "deadline")
            self.close(sid)

    def close(
        self, sid: str, outcome: Outcome = Outcome.TRUNCATED_DEADLINE, reason: str = "closed"
    ) -> Session:
        """End a session (if it has not ended) and keep it among the ended ones."""
        session = self._open.pop(sid, None)
        if session is None:
            found = self._ended.get(sid)
            if found is None:
                raise OpenAIError(404, f"no session {sid!r}", code="session_not_found")
            return found
        session.end(outcome, reason)
        timer = self._timers.pop(sid, None)
        if timer is not None:
            timer.cancel()
        self._ended[sid] = session
        while len(self._ended) > self.settings.ended_sessions_kept:
            _, forgotten = self._ended.popitem(last=False)
            self._by_key.pop(forgotten.key, None)
        return session

    def ended_as(self, sid: str) -> Outcome | None:
        """How the session `sid` has ended so far (None: still open, or unknown)."""
        session = self._open.get(sid) or self._ended.get(sid)
        return session.outcome if session is not None else None

    def find(self, sid: str | None, key: str | None) -> Session:
        """The session a call names (see the module docstring); OpenAIError when it may not call it."""
        if not key:
            raise OpenAIError(
                401,
                "send the session's key as the API key (Authorization: Bearer ...)",
                "authentication_error",
                "invalid_api_key",
            )
        sid = sid or self._by_key.get(key)
        session = self._open.get(sid or "") or self._ended.get(sid or "")
        if session is None:
            raise OpenAIError(
                404, "unknown session: open one first", "invalid_request_error", "session_not_found"
            )
        if not hmac.compare_digest(session.key.encode(), key.encode()):
            raise OpenAIError(
                401, "this key is not this session's", "authentication_error", "invalid_api_key"
            )
        return session

    def close_all(self) -> None:
        for sid in list(self._open):
            self.close(sid, Outcome.TRUNCATED_DEADLINE, "gateway stopped")
