"""A gateway session: one attempt of a group (one trajectory), driven by an OpenAI client.

Each call (`Session.call`), one at a time:

1. refused when the session has ended (403; 409 while another call runs), or past its deadline;
2. its context: the first call's messages rendered once (`Conversation.from_messages`); a
   later call's added messages appended after the ids the engine saw (`add_messages`: no
   history is re-tokenised); a changed history re-rendered (`rebase`, a `HistoryDrift`);
3. the length controls of `agents.limits`, as for our own scaffold: a call past the turn or
   token budget ends the session (`truncated:turns|tokens`, 403), a context at the cap ends it
   as `truncated:context` (400 `context_length_exceeded`, as OpenAI answers an overflow);
   `max_tokens` is clipped to the call's budget;
4. the engine call (`agents.gateway.generation`); an engine failure leaves the session as it
   was before the call (the client may retry the same request: 503) and is counted;
5. the reply read (tool calls parsed when the request has tools), the turn written as a
   `turn.generated` event (prompt delta ids, output ids, logprobs, versions, drift) through
   the session's `emit` before the answer leaves, and the seen history updated.

`end(outcome)` ends a session (a limit, the deadline, the rollout worker's abort or close) and
aborts a call in flight on the engine; that call then answers 403 and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from agents.chat import ChatFormat
from agents.chat_tools import ParsedReply, parse_tool_calls
from agents.conversation import Conversation
from agents.engine.protocol import EngineError, SamplingParams
from agents.gateway.errors import OpenAIError, context_exceeded, engine_unavailable, session_ended
from agents.gateway.generation import Completion, ReplyText, StreamingPolicy, generate_reply
from agents.gateway.history import Extend, Seen
from agents.gateway.metrics import GatewayMetrics
from agents.gateway.requests import ChatRequest, Message
from agents.identity import request_id, sampling_seed
from agents.limits import CallBudget, next_call_budget, stop_after_call
from streams.outcomes import Outcome
from streams.payloads import HistoryDrift, Limits, Payload, TurnGenerated

Emit = Callable[[Payload], Awaitable[None]]


@dataclass(frozen=True)
class SamplingDefaults:
    """Sampling for requests that do not say (a rollout worker passes `[agent]`'s)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1


@dataclass(frozen=True)
class SessionSpec:
    run_id: str
    group_id: str
    trajectory_id: str
    task_id: str
    limits: Limits
    timeout_s: float
    sampling: SamplingDefaults = SamplingDefaults()


@dataclass(frozen=True)
class CallResult:
    turn: int
    completion: Completion
    reply: ParsedReply
    finish_reason: str  # OpenAI's: stop | length | tool_calls
    prompt_tokens: int  # the context the engine was sent
    prompt_ids: list[int] | None  # a copy of it, when the request asked for token ids


@dataclass
class SessionCounters:
    turns: int = 0
    generated: int = 0
    llm_s: float = 0.0
    queue_s: float = 0.0
    engine_errors: int = 0
    tool_call_errors: int = 0


@dataclass
class Session:
    sid: str
    key: str
    spec: SessionSpec
    chat: ChatFormat
    policy: StreamingPolicy
    emit: Emit
    metrics: GatewayMetrics
    deadline: float = 0.0
    seen: Seen = field(default_factory=Seen.nothing)
    conversation: Conversation | None = None
    counters: SessionCounters = field(default_factory=SessionCounters)
    outcome: Outcome | None = None
    reason: str = ""
    weight_version: int | None = None
    last_engine_error: EngineError | None = None
    _rid: str | None = None  # the engine request in flight

    def __post_init__(self) -> None:
        self.deadline = self.deadline or time.monotonic() + self.spec.timeout_s

    @property
    def context_tokens(self) -> int:
        return len(self.conversation) if self.conversation is not None else 0

    @property
    def drifts(self) -> list[HistoryDrift]:
        return self.conversation.drifts if self.conversation is not None else []

    def end(self, outcome: Outcome, reason: str) -> None:
        """End the session (idempotent: the first ending stays); a call in flight is aborted."""
        if self.outcome is None:
            self.outcome, self.reason = outcome, reason
            self.metrics.sessions_ended[outcome.value] += 1
        if self._rid is not None:
            asyncio.get_running_loop().create_task(self._abort(self._rid))

    async def _abort(self, rid: str) -> None:
        with contextlib.suppress(Exception):
            await self.policy.abort(rid)

    async def call(
        self, request: ChatRequest, on_tokens: Callable[[ReplyText], Awaitable[None]] | None = None
    ) -> CallResult:
        """One chat completion (see the module docstring); OpenAIError when it is refused or fails."""
        if self._rid is not None:
            raise OpenAIError(409, "a call on this session is still running", code="session_busy")
        self._check_open()
        turn = self.counters.turns + 1
        self._rid = request_id(self.spec.trajectory_id, turn)
        try:
            return await self._call(request, turn, on_tokens)
        finally:
            self._rid = None

    def _check_open(self) -> None:
        if self.outcome is None and time.monotonic() >= self.deadline:
            self.end(Outcome.TRUNCATED_TIME, "deadline")
        if self.outcome is not None:
            raise session_ended(self.reason)

    async def _call(
        self, request: ChatRequest, turn: int, on_tokens: Callable[[ReplyText], Awaitable[None]] | None
    ) -> CallResult:
        before = self.conversation.checkpoint() if self.conversation is not None else None
        plan, whole, drift = self._context(request, turn)
        budget = self._budget()
        try:
            completion, latency_s = await self._generate(request, turn, budget, on_tokens)
        except BaseException:
            self._restore(before)
            raise
        if self.outcome is not None:  # ended while the engine ran (abort, deadline): nothing is written,
            self._restore(before)  # and the session holds what its log holds (no drift of an unlogged call)
            raise session_ended(self.reason)
        assert self.conversation is not None
        reply = (
            parse_tool_calls(completion.text, self._rid or "")
            if request.parse_tools
            else ParsedReply(completion.text)
        )
        answer = assistant_message(reply)
        observation = self.conversation.take_pending_observation()
        prompt_tokens = len(self.conversation)
        prompt_ids = list(self.conversation.ids) if request.return_token_ids else None
        self.conversation.add_output(completion.output_ids, answer)
        added = plan.added if isinstance(plan, Extend) else None
        self.seen.update(request.raw_messages, request.tools, added, whole, answer)
        await self._record(turn, completion, observation, drift, reply, latency_s)
        capped = stop_after_call(budget, len(completion.output_ids), completion.finish_reason)
        if capped is not None:
            self.end(capped, capped.value)
        finish = (
            "tool_calls"
            if reply.tool_calls
            else ("length" if completion.finish_reason == "length" else "stop")
        )
        return CallResult(turn, completion, reply, finish, prompt_tokens, prompt_ids)

    def _context(
        self, request: ChatRequest, turn: int
    ) -> tuple[object, list[Message] | None, HistoryDrift | None]:
        plan, whole = self.seen.plan(request.raw_messages, request.tools)
        if self.conversation is None:
            assert whole is not None  # nothing seen yet: the slow path normalised every message
            self.conversation = Conversation.from_messages(self.chat, whole, request.tools)
            return plan, whole, None
        if isinstance(plan, Extend):
            self.conversation.add_messages(plan.added)
            return plan, whole, None
        assert whole is not None
        drift = self.conversation.rebase(whole, request.tools, turn, plan.message, plan.reason)
        self.metrics.drifts[plan.reason] += 1
        return plan, whole, drift

    def _restore(self, before: object) -> None:
        if before is None:
            self.conversation = None
        elif self.conversation is not None:
            self.conversation.restore(before)  # type: ignore[arg-type]

    def _budget(self) -> CallBudget:
        c = self.counters
        budget = next_call_budget(self.spec.limits, c.turns, c.generated, self.context_tokens)
        if budget.stop is not None:
            self.end(budget.stop, budget.stop.value)
            if budget.stop == Outcome.TRUNCATED_CONTEXT:
                raise context_exceeded(
                    f"the context ({self.context_tokens} tokens) reached the session's context cap "
                    f"({self.spec.limits.context_cap} tokens)"
                )
            raise session_ended(self.reason)
        return budget

    async def _generate(
        self,
        request: ChatRequest,
        turn: int,
        budget: CallBudget,
        on_tokens: Callable[[ReplyText], Awaitable[None]] | None,
    ) -> tuple[Completion, float]:
        assert self.conversation is not None
        params = self._params(request, turn, budget)
        started = time.monotonic()
        try:
            completion = await generate_reply(
                self.policy,
                self.chat,
                self.conversation.encoded_ids(),  # the context's JSON, each piece encoded once
                params,
                self._rid or "",
                request.stop,
                on_tokens,
            )
        except EngineError as error:
            self.counters.engine_errors += 1
            self.metrics.engine_errors[error.kind] += 1
            if error.kind == "context":
                self.end(Outcome.TRUNCATED_CONTEXT, "context_length_exceeded")
                raise context_exceeded(error.message) from None
            self.last_engine_error = error
            raise engine_unavailable(error.message) from None
        finally:
            latency_s = time.monotonic() - started
            self.counters.llm_s += latency_s
        if completion.finish_reason == "abort" and self.outcome is None:
            self.counters.engine_errors += 1
            self.metrics.engine_errors["abort"] += 1
            raise engine_unavailable("the engine aborted the request (not this session)")
        return completion, latency_s

    def _params(self, request: ChatRequest, turn: int, budget: CallBudget) -> SamplingParams:
        defaults = self.spec.sampling
        return SamplingParams(
            max_new_tokens=min(request.max_tokens or budget.max_new_tokens, budget.max_new_tokens),
            temperature=defaults.temperature if request.temperature is None else request.temperature,
            top_p=defaults.top_p if request.top_p is None else request.top_p,
            top_k=defaults.top_k if request.top_k is None else request.top_k,
            seed=sampling_seed(self.spec.trajectory_id, turn) if request.seed is None else request.seed,
            stop_token_ids=() if request.ignore_eos else self.chat.stop_token_ids,
            top_logprobs=request.top_logprobs,
        )

    async def _record(
        self,
        turn: int,
        completion: Completion,
        observation: list[int],
        drift: HistoryDrift | None,
        reply: ParsedReply,
        latency_s: float,
    ) -> None:
        c = self.counters
        c.turns = turn
        c.generated += len(completion.output_ids)
        c.queue_s += completion.queue_wait_s
        if reply.error is not None:
            c.tool_call_errors += 1
            self.metrics.tool_call_errors += 1
        self.weight_version = completion.weight_version
        self.metrics.turns += 1
        await self.emit(
            TurnGenerated(
                turn=turn,
                observation_token_ids=observation,
                output_token_ids=list(completion.output_ids),
                output_logprobs=list(completion.output_logprobs),
                output_versions=list(completion.output_versions),
                finish_reason=completion.finish_reason,
                engine_id=completion.engine_id,
                weight_version=completion.weight_version,
                context_tokens=self.context_tokens,
                queue_wait_s=max(completion.queue_wait_s, 0.0),
                latency_s=max(latency_s, 0.0),
                drift=drift,
                tool_call_error=reply.error,
            )
        )


def assistant_message(reply: ParsedReply) -> Message:
    """The answer as the client will send it back (normalised, `agents.gateway.requests`)."""
    message: Message = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [call.openai() for call in reply.tool_calls]
    return message
