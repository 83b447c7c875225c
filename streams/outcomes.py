"""How a trajectory ended. Infrastructure failure is its own outcome, never a score."""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    TRUNCATED_TURNS = "truncated:turns"
    TRUNCATED_TOKENS = "truncated:tokens"
    TRUNCATED_CONTEXT = "truncated:context"
    TRUNCATED_DEADLINE = "truncated:deadline"
    TRUNCATED_TIME = "truncated:time"  # the task's agent time budget (`[agent] timeout_sec`) ran out
    INFRA_SANDBOX_START = "infra_error:sandbox_start"
    INFRA_SANDBOX_LOST = "infra_error:sandbox_lost"
    INFRA_ENGINE = "infra_error:engine"
    INFRA_NETWORK = "infra_error:network"
    INFRA_TIMEOUT = "infra_error:timeout"
    INFRA_VERIFIER = "infra_error:verifier"
    INFRA_AGENT = "infra_error:agent"  # an off-the-shelf scaffold crashed (not the policy's answer)

    @property
    def is_infra_error(self) -> bool:
        return self.value.startswith("infra_error:")

    @property
    def is_truncated(self) -> bool:
        return self.value.startswith("truncated:")

    @property
    def is_scored(self) -> bool:
        """Resolved, unresolved and truncated episodes carry a reward; infra errors never do."""
        return not self.is_infra_error


INFRA_KINDS = ("sandbox_start", "sandbox_lost", "engine", "network", "timeout", "verifier", "agent")


def infra_outcome(kind: str) -> Outcome:
    """The outcome for an infrastructure error kind such as `sandbox_start`."""
    return Outcome(f"infra_error:{kind}")
