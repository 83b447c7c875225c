"""A recorded run read back for the commands that replay it (`replay`, `whatif`, `tail`).

`load_run` reads a run's rollout events from the topics or the SQL store, with a clear error
when there are none; `policies` is the recorded policy and the one to replay with.
"""

from __future__ import annotations

import asyncio

from rollstream.command_line import console, fail
from rollstream.config import Config
from streams.events import DecodeError
from streams.policies import explicit_policy_keys, replay_policy
from streams.replay import RecordedRun, load_from_db, load_from_topics
from streams.settings import PolicySettings


def load_run(cfg: Config, run: str, from_db: bool) -> RecordedRun:
    """The recorded run from the topics or the SQL store; a clear error when it has no events."""
    with console.status(f"reading run {run} from {'the SQL store' if from_db else 'the topics'}"):
        try:
            recorded = (
                load_from_db(cfg.db_url, run)
                if from_db
                else asyncio.run(load_from_topics(cfg.kafka, cfg.topics, run))
            )
        except DecodeError as error:
            fail(f"cannot read run {run}: {error}")
    if not recorded.events:
        where = cfg.db_url if from_db else f"topic {cfg.topics.prefix}rollout.events at {cfg.kafka.bootstrap}"
        fail(f"run {run!r} has no rollout events in {where}; check --run (and --from-db / topics.prefix)")
    return recorded


def policies(
    cfg: Config, recorded: RecordedRun, overrides: list[str]
) -> tuple[PolicySettings, PolicySettings]:
    """(recorded policy, the policy to replay with: recorded plus explicit --set policy.* keys)."""
    base = replay_policy(recorded.recorded_policy(), cfg.policy, set())
    return base, replay_policy(recorded.recorded_policy(), cfg.policy, explicit_policy_keys(overrides))
