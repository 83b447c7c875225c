"""One agent episode: a sandbox from the pool, model turns, tool runs, the verifier, and events.

Events (one `EventSink`, seq gap-free from 0, ids from (trajectory id, seq)):

    trajectory.started (prompt token ids, limits) -> sandbox.requested ->
    sandbox.ready | sandbox.failed -> (turn.generated -> tool.executed)* ->
    tests.ran -> sandbox.released -> trajectory.finished

Token layout: the prompt is in `trajectory.started`; each `turn.generated` carries
the ids appended to the context since the previous turn's output (observation,
loss mask 0; empty on turn 1) and the engine's output ids, logprobs and versions
exactly as returned. The context sent to the engine is always prompt + the
concatenation of those arrays.

How it ends: `agents.episode_spec.Ending` (each step returns one rather than raising, so `run`
reads top-down: start, sandbox, turns, verifier, finish).

A task cancelled without `abort()` (worker shutdown) writes nothing more: its
request is re-run elsewhere and the re-run writes the same ids.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING

from agents.conversation import Conversation
from agents.engine.protocol import EngineError, Generation, SamplingParams
from agents.episode_spec import (
    ENGINE_ERROR_OUTCOMES,
    MIN_COMMAND_TIMEOUT_S,
    Counters,
    Ending,
    EpisodeServices,
    EpisodeSpec,
    EventSink,
)
from agents.identity import request_id, sampling_seed
from agents.limits import CallBudget, next_call_budget, stop_after_call
from agents.scaffold import (
    Action,
    FormatError,
    instance_prompt,
    parse_reply,
    render_observation,
    system_prompt,
)
from sandboxes.base import Sandbox, SandboxError, VerifierError
from streams.events import make_event
from streams.outcomes import Outcome, infra_outcome
from streams.payloads import (
    Payload,
    SandboxFailed,
    SandboxReady,
    SandboxReleased,
    SandboxRequested,
    TestsRan,
    ToolExecuted,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
)

if TYPE_CHECKING:
    from sandboxes.tasks import Verdict


class Episode:
    """Our bash scaffold's episode; `scaffold` names the agent on `trajectory.started`, and a
    subclass that runs another agent replaces `_start_conversation` and `_turns`
    (`agents.mini_swe.episode`)."""

    scaffold = "bash"

    def __init__(self, spec: EpisodeSpec, services: EpisodeServices, sink: EventSink) -> None:
        self.spec = spec
        self.services = services
        self.sink = sink
        self.seq = 0
        self.version: int | None = None  # the engine's, once a generation reported it (events carry it)
        self.aborted: str | None = None
        self.counters = Counters()
        self._task: asyncio.Task[TrajectoryFinished] | None = None
        self._cancellable = False
        self._rid: str | None = None
        self._agent_deadline = float("inf")  # set when the agent's turns begin
        self.conversation = self._start_conversation()

    def _start_conversation(self) -> Conversation:
        system = system_prompt(self.services.agent.submit_command)
        return Conversation.start(self.services.chat, system, instance_prompt(self.spec.task.instruction))

    # ---- control -------------------------------------------------------------------

    def abort(self, reason: str = "group_deadline") -> None:
        """End the episode now as `truncated:deadline` (idempotent)."""
        if self.aborted is not None:
            return
        self.aborted = reason
        if self._cancellable and self._task is not None:
            self._task.cancel(f"abort: {reason}")

    async def run(self) -> TrajectoryFinished:
        self._task = asyncio.current_task()  # type: ignore[assignment]
        started = time.monotonic()
        prompt = self.conversation.prompt if self.conversation.pieces else []
        s = self.spec
        await self._emit(
            TrajectoryStarted(
                attempt=s.attempt,
                retry=s.retry,
                group_size=s.group_size,
                limits=s.limits,
                prompt_token_ids=prompt,
                scaffold=self.scaffold,
            )
        )
        ending = await self._run_cancellable()
        return await self._finish(ending, time.monotonic() - started)

    def _deadline_ending(self) -> Ending:
        return Ending(Outcome.TRUNCATED_DEADLINE, 0.0, f"aborted: {self.aborted}")

    async def _run_cancellable(self) -> Ending:
        if self.aborted is not None:
            return self._deadline_ending()
        self._cancellable = True
        try:
            return await self._in_sandbox()
        except asyncio.CancelledError:
            if self.aborted is None:
                raise  # shutdown: write nothing more
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            await self._abort_in_flight()
            return self._deadline_ending()
        finally:
            self._cancellable = False

    async def _abort_in_flight(self) -> None:
        if self._rid is None:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.services.policy.abort(self._rid), timeout=10.0)

    # ---- sandbox ------------------------------------------------------------------

    def _sandbox(self) -> AbstractAsyncContextManager[Sandbox]:
        """The task's sandbox: over its workspace, in its own image when it names one."""
        task, source = self.spec.task, self.services.sandboxes
        image = task.environment.docker_image
        return source.sandbox(task.workspace, image=image) if image else source.sandbox(task.workspace)

    async def _in_sandbox(self) -> Ending:
        backend = self.services.backend
        await self._emit(SandboxRequested(backend=backend))
        box: Sandbox | None = None
        ready_at = 0.0
        try:
            async with self._sandbox() as box:
                ready_at = time.monotonic()
                await self._sandbox_ready(box)
                return await self._episode(box)
        except SandboxError as error:
            kind = error.kind if box is None or error.kind != "sandbox_start" else "sandbox_lost"
            await self._emit(
                SandboxFailed(
                    backend=backend,
                    error_kind=kind,
                    message=str(error),
                    injected=error.injected,
                )
            )
            return Ending(infra_outcome(kind), None, f"{type(error).__name__}: {error}", error.injected)
        finally:
            if box is not None and ready_at and (self.aborted is not None or not self._cancelled()):
                lifetime = time.monotonic() - ready_at
                await self._emit(SandboxReleased(backend=backend, sandbox_id=box.id, lifetime_s=lifetime))

    def _cancelled(self) -> bool:
        task = asyncio.current_task()
        return task is not None and task.cancelling() > 0

    async def _sandbox_ready(self, box: Sandbox) -> None:
        timings = box.timings
        self.counters.sandbox_start_s = timings.start_s
        self.counters.queue_s = timings.queued_s
        await self._emit(
            SandboxReady(
                backend=box.backend,
                sandbox_id=box.id,
                queue_wait_s=max(timings.queued_s, 0.0),
                cap_waits=dict(timings.cap_waits),
                start_s=max(timings.start_s, 0.0),
            )
        )

    async def _episode(self, box: Sandbox) -> Ending:
        """Turns until an end, then the verifier (except on infrastructure errors)."""
        stopped = await self._turns(box)
        if stopped is not None and stopped.outcome.is_infra_error:
            return stopped  # the infrastructure's fault: no verifier, never a score
        verdict = await self._verify(box)
        if isinstance(verdict, Ending):
            return verdict
        return Ending.judged(stopped, verdict)

    async def _verify(self, box: Sandbox) -> Verdict | Ending:
        t0 = time.monotonic()
        try:
            verdict = await self.services.verifier(box, self.spec.task)
        except VerifierError as error:  # other sandbox errors are the sandbox's: sandbox.failed
            return Ending(Outcome.INFRA_VERIFIER, None, f"verifier: {error}")
        self.counters.tests_s = time.monotonic() - t0
        await self._emit(
            TestsRan(
                fail_to_pass=dict(verdict.fail_to_pass),
                pass_to_pass=dict(verdict.pass_to_pass),
                duration_s=max(verdict.duration_s, 0.0),
                reward=verdict.reward,
            )
        )
        return verdict

    # ---- turns --------------------------------------------------------------------

    async def _turns(self, box: Sandbox) -> Ending | None:
        """Run turns until one ends them: None when the agent submitted (or gave up on format),
        else what stopped them (a `truncated:*` cap, or an engine failure)."""
        c = self.counters
        format_errors = 0
        self._agent_deadline = time.monotonic() + self.spec.task.agent_timeout_s
        while True:
            budget = next_call_budget(self.spec.limits, c.turns, c.generated, len(self.conversation))
            if budget.stop is not None:
                return Ending(budget.stop)
            if self._agent_time_left() <= 0:
                return Ending(Outcome.TRUNCATED_TIME)
            generation = await self._generate(budget)
            if isinstance(generation, Ending):
                return generation
            capped = stop_after_call(budget, len(generation.output_ids), generation.finish_reason)
            if capped is not None:
                return Ending(capped)
            text = self.services.chat.reply_text(generation.output_ids)
            reply = parse_reply(text, self.services.agent.submit_command)
            if isinstance(reply, FormatError):
                format_errors += 1
                await self._show_format_error(reply, generation)
                if format_errors >= self.services.agent.max_format_errors:
                    return None
                continue
            format_errors = 0
            if await self._act(box, reply, generation):
                return None

    async def _generate(self, budget: CallBudget) -> Generation | Ending:
        """The next turn's generation, or how the engine ended the episode (a refused context is
        `truncated:context`, a length control; anything else an infrastructure error)."""
        c = self.counters
        turn = c.turns + 1
        agent = self.services.agent
        params = SamplingParams(
            max_new_tokens=budget.max_new_tokens,
            temperature=agent.temperature,
            top_p=agent.top_p,
            top_k=agent.top_k,
            seed=sampling_seed(self.spec.trajectory_id, turn),
            stop_token_ids=self.services.chat.stop_token_ids,
        )
        self._rid = request_id(self.spec.trajectory_id, turn)
        t0 = time.monotonic()
        try:  # on cancellation `_rid` stays set, so a deadline abort can abort it in the engine
            generation = await self.services.policy.generate(list(self.conversation.ids), params, self._rid)
        except EngineError as error:
            self._rid = None
            outcome = ENGINE_ERROR_OUTCOMES.get(error.kind, Outcome.INFRA_ENGINE)
            return Ending(outcome, None, None if outcome.is_truncated else str(error), error.injected)
        finally:
            c.llm_s += time.monotonic() - t0
        self._rid = None
        if generation.finish_reason == "abort":
            return Ending(Outcome.INFRA_ENGINE, None, "the engine aborted the request (not by this episode)")
        c.turns = turn
        c.generated += len(generation.output_ids)
        observation = self.conversation.take_pending_observation()
        self.conversation.add_output(generation.output_ids)
        self.version = generation.weight_version
        await self._emit(
            TurnGenerated(
                turn=turn,
                observation_token_ids=observation,
                output_token_ids=list(generation.output_ids),
                output_logprobs=list(generation.output_logprobs),
                output_versions=list(generation.output_versions),
                finish_reason=generation.finish_reason,
                engine_id=generation.engine_id,
                weight_version=generation.weight_version,
                context_tokens=len(self.conversation),
                queue_wait_s=max(generation.queue_wait_s, 0.0),
                latency_s=max(generation.latency_s, 0.0),
            )
        )
        return generation

    async def _show_format_error(self, error: FormatError, generation: Generation) -> None:
        message = error.message
        await self._emit(
            ToolExecuted(
                turn=self.counters.turns,
                command="",
                exit_code=None,
                output=message,
                output_bytes=len(message.encode()),
                truncated=False,
                duration_s=0.0,
                format_error=True,
            )
        )
        self.conversation.add_observation(message)

    async def _act(self, box: Sandbox, action: Action, generation: Generation) -> bool:
        """Run the action's command (if any); True when the agent submits."""
        if not action.command:
            return action.submits
        timeout = max(min(self.services.command_timeout_s, self._agent_time_left()), MIN_COMMAND_TIMEOUT_S)
        t0 = time.monotonic()
        shell = f"{self.services.agent.shell} -c {shlex.quote(action.command)}"
        result = await box.exec(shell, timeout=timeout)
        self.counters.tool_s += time.monotonic() - t0
        output = result.stdout + result.stderr
        shown = render_observation(
            result.exit_code, output, self.spec.limits.tool_output_chars, result.timed_out, timeout
        )
        await self._emit(
            ToolExecuted(
                turn=self.counters.turns,
                command=action.command,
                exit_code=result.exit_code,
                output=shown.text,
                output_bytes=max(result.output_bytes, len(output.encode())),
                truncated=shown.truncated or result.output_truncated,
                duration_s=max(result.duration_s, 0.0),
                timed_out=result.timed_out,
            )
        )
        if action.submits:
            return True
        self.conversation.add_observation(shown.text)
        return False

    def _agent_time_left(self) -> float:
        return self._agent_deadline - time.monotonic()

    # ---- events -------------------------------------------------------------------

    async def _emit(self, data: Payload) -> None:
        s = self.spec
        event = make_event(
            data,
            run_id=s.run_id,
            seq=self.seq,
            time_ns=time.time_ns(),
            source=self.services.source,
            group_id=s.group_id,
            trajectory_id=s.trajectory_id,
            task_id=s.task.id,
            policy_version=self.version,
        )
        self.seq += 1
        # shielded: a deadline abort must not leave a seq half-written (gap or reuse)
        await asyncio.shield(self.sink.emit(event))

    async def _finish(self, ending: Ending, total_s: float) -> TrajectoryFinished:
        c = self.counters
        finished = TrajectoryFinished(
            outcome=ending.outcome,
            reward=None if ending.outcome.is_infra_error else ending.reward,
            turns=c.turns,
            generated_tokens=c.generated,
            context_tokens=len(self.conversation),
            last_seq=self.seq,
            error=ending.error,
            times=c.times(total_s),
            injected=ending.injected and ending.outcome.is_infra_error,
            render_drift=self.conversation.drift(),
            history_drifts=len(self.conversation.drifts),
            history_drift=self.conversation.drifts[0] if self.conversation.drifts else None,
        )
        await self._emit(finished)
        return finished
