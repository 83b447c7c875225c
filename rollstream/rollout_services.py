"""What an episode needs from the configured deployment: `episode_services` builds the
`EpisodeServices` of a rollout worker (policy, sandbox pool, verifier with the task set's cap,
chat format, agent settings, gateway) for `rollstream rollout`, evaluation and the tests.
"""

from __future__ import annotations

from agents.chat import ChatFormat
from agents.episode import EpisodeServices
from agents.mini_swe.runtime import AgentGateway
from agents.policy import Policy
from agents.worker_setup import worker_name
from rollstream.config import Config
from sandboxes.base import Sandbox
from sandboxes.pool import SandboxPool
from sandboxes.tasks import Task, Verdict, run_verifier


def episode_services(
    cfg: Config, policy: Policy, pool: SandboxPool, chat: ChatFormat, gateway: AgentGateway | None = None
) -> EpisodeServices:
    verifier_cap = cfg.tasks.verifier_timeout_s

    async def verify(box: Sandbox, task: Task) -> Verdict:
        return await run_verifier(box, task, min(task.verifier_timeout_s, verifier_cap))

    return EpisodeServices(
        policy=policy,
        sandboxes=pool,
        verifier=verify,
        chat=chat,
        agent=cfg.agent,
        backend=cfg.sandbox.backend,
        source=worker_name(),
        command_timeout_s=cfg.sandbox.limits.command_timeout_s,
        gateway=gateway,
    )
