"""Sessions opened and closed over HTTP: a standalone gateway (`rollstream gateway serve`) for a
harness that runs its own OpenAI-speaking agent and its own verifier.

    POST /sessions              {"run_id", "task_id", "group": 0, "attempt": 0, "retry": 0,
                                 "group_size": 1, "limits": {...}, "timeout_s": ..., "temperature": ...}
        -> 201 {"session_id", "api_key", "base_url", "model", "trajectory_id", "group_id"}
    POST /sessions/{id}/close   {"reward": 1.0} or {"outcome": "infra_error:sandbox_lost", "error": "..."}
        -> 200 {"trajectory_id", "outcome", "reward", "turns", "history_drifts"}

Both need the admin token (`Authorization: Bearer <token>`, `gateway.admin_token_env`). A
session is one trajectory with the ids our rollout worker would give that attempt
(`agents.identity`): `trajectory.started` at open, a `turn.generated` per call, and at close
`trajectory.finished` with the harness's reward (`resolved` at reward >= 1, else `unresolved`;
a session the gateway ended itself keeps its `truncated:*` outcome; an infra outcome has no
reward). Groups then form from these trajectories like from any others.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.episode import EventSink
from agents.gateway.errors import OpenAIError, bad_request
from agents.gateway.registry import Gateway
from agents.gateway.server import GatewayServer, bearer, json_body
from agents.gateway.session import SamplingDefaults, Session, SessionSpec
from agents.identity import group_id, trajectory_id
from streams.events import make_event
from streams.outcomes import Outcome
from streams.payloads import (
    Limits,
    Payload,
    TimeBreakdown,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
)


class OpenRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str = Field(min_length=1)
    task_id: str = Field(min_length=1)
    group: int = Field(default=0, ge=0, description="the group's index among the task's groups in the run")
    attempt: int = Field(default=0, ge=0)
    retry: int = Field(default=0, ge=0)
    group_size: int = Field(default=1, ge=1)
    limits: Limits = Limits()
    timeout_s: float | None = Field(default=None, gt=0)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    top_k: int = -1


class CloseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    reward: float | None = None
    outcome: Outcome | None = None
    error: str | None = None


class TrajectoryLog:
    """One session's events, in order (seq from 0), to the sink."""

    def __init__(self, sink: EventSink, spec: SessionSpec, source: str) -> None:
        self.sink, self.spec, self.source = sink, spec, source
        self.seq = 0
        self.version: int | None = None
        self.started = time.monotonic()

    async def emit(self, data: Payload) -> None:
        if isinstance(data, TurnGenerated):
            self.version = data.weight_version
        s = self.spec
        event = make_event(
            data,
            run_id=s.run_id,
            seq=self.seq,
            time_ns=time.time_ns(),
            source=self.source,
            group_id=s.group_id,
            trajectory_id=s.trajectory_id,
            task_id=s.task_id,
            policy_version=self.version,
        )
        self.seq += 1
        await self.sink.emit(event)


class SessionAdmin:
    def __init__(self, gateway: Gateway, sink: EventSink, token: str, source: str) -> None:
        self.gateway, self.sink, self.token, self.source = gateway, sink, token, source
        self.logs: dict[str, TrajectoryLog] = {}
        self.server: GatewayServer | None = None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/sessions", self.open)
        app.router.add_post("/sessions/{sid}/close", self.close)

    def _check(self, request: web.Request) -> None:
        given = bearer(request) or ""
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            message = "opening and closing sessions needs the gateway's admin token"
            raise OpenAIError(401, message, "authentication_error", "invalid_admin_token")

    async def open(self, request: web.Request) -> web.Response:
        try:
            self._check(request)
            asked = _parse(OpenRequest, await json_body(request))
        except OpenAIError as error:
            return web.json_response(error.body(), status=error.status)
        group = group_id(asked.run_id, asked.task_id, asked.group)
        spec = SessionSpec(
            run_id=asked.run_id,
            group_id=group,
            trajectory_id=trajectory_id(group, asked.attempt, asked.retry),
            task_id=asked.task_id,
            limits=asked.limits,
            timeout_s=asked.timeout_s or self.gateway.settings.session_timeout_s,
            sampling=SamplingDefaults(asked.temperature, asked.top_p, asked.top_k),
        )
        log = TrajectoryLog(self.sink, spec, self.source)
        started = TrajectoryStarted(
            attempt=asked.attempt,
            retry=asked.retry,
            group_size=asked.group_size,
            limits=asked.limits,
            scaffold="gateway",
        )
        await log.emit(started)
        session = self.gateway.open(spec, log.emit)
        self.logs[session.sid] = log
        base = self.server.base_url(session.sid) if self.server is not None else ""
        return web.json_response(
            {
                "session_id": session.sid,
                "api_key": session.key,
                "base_url": base,
                "model": self.gateway.model_name,
                "trajectory_id": spec.trajectory_id,
                "group_id": group,
            },
            status=201,
        )

    async def close(self, request: web.Request) -> web.Response:
        try:
            self._check(request)
            asked = _parse(CloseRequest, await json_body(request))
            sid = request.match_info["sid"]
            log = self.logs.get(sid)
            if log is None:
                raise OpenAIError(404, f"no open session {sid!r}", code="session_not_found")
            outcome, reward = closing_outcome(self.gateway.ended_as(sid), asked)
            session = self.gateway.close(sid)
        except OpenAIError as error:
            return web.json_response(error.body(), status=error.status)
        del self.logs[sid]
        finished = finished_event(session, log, outcome, reward, asked.error)
        await log.emit(finished)
        reply = {"trajectory_id": session.spec.trajectory_id, "outcome": outcome.value, "reward": reward}
        return web.json_response(
            {**reply, "turns": finished.turns, "history_drifts": finished.history_drifts}
        )


def _parse(model: type[BaseModel], body: Any) -> Any:
    try:
        return model.model_validate(body)
    except ValidationError as error:
        raise bad_request(f"bad request: {error.errors()[0]['loc']}: {error.errors()[0]['msg']}") from None


def closing_outcome(ended: Outcome | None, asked: CloseRequest) -> tuple[Outcome, float | None]:
    """How a closed session's trajectory ended (module docstring); `ended`: how the session ended
    itself before the close, if it did."""
    if ended is not None and ended.is_truncated:
        return ended, asked.reward if asked.reward is not None else 0.0
    if asked.outcome is not None:
        reward = None if asked.outcome.is_infra_error else (asked.reward or 0.0)
        return asked.outcome, reward
    if asked.reward is None:
        raise bad_request("close a session with its reward, or with an outcome (an infra error has none)")
    return (Outcome.RESOLVED if asked.reward >= 1.0 else Outcome.UNRESOLVED), asked.reward


def finished_event(
    session: Session, log: TrajectoryLog, outcome: Outcome, reward: float | None, error: str | None
) -> TrajectoryFinished:
    c, drifts = session.counters, session.drifts
    conversation = session.conversation
    return TrajectoryFinished(
        outcome=outcome,
        reward=reward,
        turns=c.turns,
        generated_tokens=c.generated,
        context_tokens=session.context_tokens,
        last_seq=log.seq,
        error=error,
        times=TimeBreakdown(llm_s=c.llm_s, queue_s=c.queue_s, total_s=time.monotonic() - log.started),
        render_drift=conversation.drift() if conversation is not None else None,
        history_drifts=len(drifts),
        history_drift=drifts[0] if drifts else None,
    )
