"""What an episode is given and how it ends (agents/episode.py runs it).

- `EpisodeSpec`: which attempt of which task, in which run and group, under which limits;
- `EpisodeServices`: what every episode of a worker shares (policy, sandboxes, verifier, chat
  format, agent settings, gateway), with the protocols they are typed by;
- `Ending`: the outcome, reward and error of `trajectory.finished`; `Counters`: its turns,
  tokens and time breakdown.

How an episode ends (`trajectory.finished.outcome`, an `Ending`):
- the agent submits, or makes `max_format_errors` format errors in a row: the
  verifier decides `resolved` (reward >= 1) or `unresolved`;
- a length control (`agents.limits`) stops it: `truncated:turns|tokens|context`,
  the verifier still runs and its reward is kept;
- the task's agent time budget (`Task.agent_timeout_s`, counted from sandbox
  ready) runs out: `truncated:time`, checked before each model call, with each
  command's timeout clipped to the time left; the verifier still runs;
- `Episode.abort()` (group deadline): the in-flight engine request is aborted,
  no verifier, `truncated:deadline` with reward 0;
- an infrastructure failure (sandbox, engine, network, verifier): `infra_error:*`
  with reward None, never a score; one injected by `sandbox.faults` / `client.faults`
  is marked `injected` on `sandbox.failed` and `trajectory.finished`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agents.chat import ChatFormat
from agents.policy import Policy
from agents.settings import AgentSettings
from sandboxes.base import Sandbox
from streams.events import Event
from streams.outcomes import Outcome
from streams.payloads import Limits, TimeBreakdown

if TYPE_CHECKING:
    from agents.mini_swe.runtime import AgentGateway
    from sandboxes.tasks import Task, Verdict

ENGINE_ERROR_OUTCOMES = {
    "network": Outcome.INFRA_NETWORK,
    "engine": Outcome.INFRA_ENGINE,
    "request": Outcome.INFRA_ENGINE,
    "context": Outcome.TRUNCATED_CONTEXT,
}
# A command's timeout is clipped to the agent's time left, but never below this: a command
# that starts with a few milliseconds left would otherwise time out before it could run.
MIN_COMMAND_TIMEOUT_S = 1.0


class EventSink(Protocol):
    async def emit(self, event: Event) -> None: ...


class SandboxSource(Protocol):
    """`sandboxes.pool.SandboxPool` (or anything with its `sandbox()`); `image` is asked for only
    by tasks that name one (`[environment] docker_image`)."""

    def sandbox(
        self, workspace: Path | None, image: str | None = None
    ) -> AbstractAsyncContextManager[Sandbox]: ...


Verifier = Callable[["Sandbox", "Task"], Awaitable["Verdict"]]


@dataclass(frozen=True)
class EpisodeSpec:
    run_id: str
    group_id: str
    trajectory_id: str
    task: Task
    attempt: int
    retry: int
    group_size: int
    limits: Limits


@dataclass(frozen=True)
class EpisodeServices:
    """What every episode of a worker shares."""

    policy: Policy
    sandboxes: SandboxSource
    verifier: Verifier
    chat: ChatFormat
    agent: AgentSettings
    backend: str
    source: str
    command_timeout_s: float
    gateway: AgentGateway | None = None  # an OpenAI-speaking scaffold's gateway (`agent.scaffold`)


@dataclass
class Counters:
    """What an episode has used so far: turns, generated tokens and where its time went."""

    turns: int = 0
    generated: int = 0
    llm_s: float = 0.0
    tool_s: float = 0.0
    tests_s: float = 0.0
    sandbox_start_s: float = 0.0
    queue_s: float = 0.0

    def times(self, total_s: float) -> TimeBreakdown:
        """`trajectory.finished`'s time breakdown of an episode that took `total_s`."""
        return TimeBreakdown(
            llm_s=self.llm_s,
            tool_s=self.tool_s,
            sandbox_start_s=self.sandbox_start_s,
            tests_s=self.tests_s,
            queue_s=self.queue_s,
            total_s=total_s,
        )


@dataclass(frozen=True)
class Ending:
    """How an episode ended: `trajectory.finished`'s outcome, reward and error.

    Every step returns one instead of raising: an infrastructure failure (reward None, no
    verifier), a length control or the agent time budget (the verifier still runs and gives
    the reward), the deadline abort (reward 0, no verifier)."""

    outcome: Outcome
    reward: float | None = None
    error: str | None = None
    injected: bool = False  # an infrastructure error injected by sandbox.faults / client.faults

    @classmethod
    def judged(cls, stopped: Ending | None, verdict: Verdict) -> Ending:
        """The verifier's ending: a length control or the time budget that stopped the turns keeps
        its outcome; when the agent submitted (`stopped` None) the reward decides resolved (>= 1)."""
        if stopped is not None:
            return cls(stopped.outcome, verdict.reward, stopped.error)
        return cls(Outcome.RESOLVED if verdict.reward >= 1.0 else Outcome.UNRESOLVED, verdict.reward)
