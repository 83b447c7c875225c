"""A mini-swe-agent episode: our episode's life (events, sandbox, verifier, outcomes) with
mini-swe-agent, unmodified, as the agent between sandbox and verifier.

The turns (`_turns`): open a gateway session for this trajectory (its events go through the
episode's own sequence, so `turn.generated` from the session and `tool.executed` from the
environment interleave gap-free), run mini-swe-agent's `DefaultAgent` with its own config in a
worker thread (`agents.mini_swe.runtime`), then close the session. How it ended:

- it submitted (or gave up after repeated format errors): the verifier decides, as for ours;
- the session ended it: a length control or the agent time budget (`truncated:*`, the verifier
  still runs), the group deadline (`truncated:deadline`, through `Episode.abort`);
- the engine failed after every retry (the gateway's 503s exhausted the agent's own retries):
  `infra_error:engine`; a sandbox failure: the sandbox's infra outcome; mini-swe-agent itself
  crashing on anything else: `infra_error:agent`. None of them is ever scored.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from agents.conversation import Conversation
from agents.episode import ENGINE_ERROR_OUTCOMES, Ending, Episode
from agents.gateway.session import SamplingDefaults, Session, SessionSpec
from agents.mini_swe.environment import (
    SandboxEnvironment,
    SandboxEnvironmentConfig,
    SessionEnded,
    sandbox_system,
)
from agents.mini_swe.runtime import AgentGateway, agent_config, load_config
from sandboxes.base import Sandbox, SandboxError
from streams.outcomes import Outcome
from streams.payloads import Payload, TurnGenerated

FINISHED_BY_AGENT = {"Submitted", "RepeatedFormatError"}  # the verifier decides
AGENT_LIMITS = {"LimitsExceeded": Outcome.TRUNCATED_TURNS, "TimeExceeded": Outcome.TRUNCATED_TIME}


class MiniSweEpisode(Episode):
    scaffold = "mini-swe-agent"

    def _start_conversation(self) -> Conversation:
        self._session: Session | None = None
        self._agent_done = False
        return Conversation(self.services.chat)  # the session's first call brings the prompt

    @property
    def _gateway(self) -> AgentGateway:
        gateway = self.services.gateway
        if gateway is None:
            raise RuntimeError("agent.scaffold = 'mini-swe-agent' needs a gateway in the episode services")
        return gateway

    async def _turns(self, box: Sandbox) -> Ending | None:
        task, agent = self.spec.task, self.services.agent
        self._agent_deadline = time.monotonic() + task.agent_timeout_s
        sampling = SamplingDefaults(agent.temperature, agent.top_p, agent.top_k)
        spec = SessionSpec(
            run_id=self.spec.run_id,
            group_id=self.spec.group_id,
            trajectory_id=self.spec.trajectory_id,
            task_id=task.id,
            limits=self.spec.limits,
            timeout_s=task.agent_timeout_s,
            sampling=sampling,
        )
        gateway = self._gateway
        session = self._session = gateway.server.gateway.open(spec, self._emit_open)
        try:
            environment = await self._environment(box, session)
            loop = asyncio.get_running_loop()
            status, error = await loop.run_in_executor(gateway.threads, self._run_agent, session, environment)
            self.counters.tool_s += environment.tool_s
            return self._ending(session, status, error)
        finally:
            self._agent_done = True
            gateway.server.gateway.close(session.sid)
            self._take_counts(session)

    async def _environment(self, box: Sandbox, session: Session) -> SandboxEnvironment:
        config = load_config(self.services.agent.mini.config)
        env_config = SandboxEnvironmentConfig(
            env={str(k): str(v) for k, v in ((config.get("environment") or {}).get("env") or {}).items()},
            shell=self.services.agent.shell,
            timeout=self.services.command_timeout_s,
            tool_output_chars=self.spec.limits.tool_output_chars,
        )
        return SandboxEnvironment(
            box,
            asyncio.get_running_loop(),
            env_config,
            emit=self._emit_open,
            turn=lambda: session.counters.turns,
            stopped=lambda: session.reason if session.outcome is not None else None,
            time_left=self._agent_time_left,
            system=await sandbox_system(box),
        )

    def _run_agent(
        self, session: Session, environment: SandboxEnvironment
    ) -> tuple[str, BaseException | None]:
        """In a worker thread: mini-swe-agent from its own config, its model pointed at the session."""
        import litellm
        from minisweagent.agents.default import DefaultAgent
        from minisweagent.models import get_model

        litellm.suppress_debug_info = True  # litellm's own setting: no provider list printed per error

        server = self._gateway.server
        config = agent_config(
            load_config(self.services.agent.mini.config),
            self.services.agent,
            server.gateway.model_name,
            server.base_url(session.sid),
            session.key,
        )
        try:
            model = get_model(config=config["model"])
            result: dict[str, Any] = DefaultAgent(model, environment, **config["agent"]).run(
                self.spec.task.instruction
            )
        except BaseException as error:  # mini re-raises what stopped it; the session says why
            return "", error
        return str(result.get("exit_status", "")), None

    def _ending(self, session: Session, status: str, error: BaseException | None) -> Ending | None:
        if session.outcome is not None:
            return Ending(session.outcome, None, None if session.outcome.is_truncated else session.reason)
        if isinstance(error, SandboxError):
            raise error  # the episode records the sandbox's failure (sandbox.failed, its infra outcome)
        if error is not None and not isinstance(error, SessionEnded):
            engine = session.last_engine_error
            if engine is not None:
                outcome = ENGINE_ERROR_OUTCOMES.get(engine.kind, Outcome.INFRA_ENGINE)
                return Ending(outcome, None, str(engine), engine.injected)
            return Ending(
                Outcome.INFRA_AGENT, None, f"mini-swe-agent stopped: {type(error).__name__}: {error}"
            )
        if status in AGENT_LIMITS:
            return Ending(AGENT_LIMITS[status])
        return None

    async def _emit_open(self, payload: Payload) -> None:
        """The session's and the environment's events, while the agent runs (never after)."""
        if self._agent_done:
            raise SessionEnded("the episode's turns are over: no more events")
        if isinstance(payload, TurnGenerated):
            self.version = payload.weight_version
        await self._emit(payload)

    def _take_counts(self, session: Session) -> None:
        c, s = self.counters, session.counters
        c.turns, c.generated, c.llm_s, c.queue_s = s.turns, s.generated, s.llm_s, c.queue_s + s.queue_s
        if session.conversation is not None:
            self.conversation = session.conversation

    async def _abort_in_flight(self) -> None:
        if self._session is not None:
            self._session.end(Outcome.TRUNCATED_DEADLINE, self.aborted or "aborted")
