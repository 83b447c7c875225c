"""Policy helpers for replay and what-if (pure): which policy applies, and cutting episodes short.

- `replay_policy(recorded, base, explicit)`: the policy a replay uses: the one
  recorded on the run's groups, with the keys the user set explicitly
  (`--set policy.KEY=...`) taken from `base`; no recording, `base` whole.
- `truncate_events(events, limits)`: a finished episode's events as they would
  have been under stricter length limits (turns, generated tokens per trajectory,
  engine context): every event up to the turn the limit stops, then a
  `trajectory.finished` with the `truncated:*` outcome and reward 0, timed at the
  last kept event. Episodes the limits do not touch come back unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

from streams.events import Event, make_event
from streams.outcomes import Outcome
from streams.payloads import Limits, TrajectoryFinished, TrajectoryStarted, TurnGenerated
from streams.settings import PolicySettings

LIMIT_KEYS = ("max_turns", "max_trajectory_tokens", "context_cap")


def replay_policy(
    recorded: PolicySettings | None, base: PolicySettings, explicit: set[str]
) -> PolicySettings:
    """The recorded policy with the explicitly set keys from `base`; nothing recorded: `base`."""
    if recorded is None:
        return base
    chosen = base.model_dump()
    return PolicySettings.model_validate({**recorded.model_dump(), **{k: chosen[k] for k in explicit}})


def explicit_policy_keys(overrides: Sequence[str]) -> set[str]:
    """`policy.max_turns=40` -> {'max_turns'}: the policy keys a user set on the command line."""
    keys = set()
    for text in overrides:
        path = text.partition("=")[0].strip().split(".")
        if len(path) == 2 and path[0] == "policy":
            keys.add(path[1])
    return keys


def cut_limits(policy: PolicySettings, explicit: set[str]) -> Limits | None:
    """Limits to cut recorded episodes to, when the user set any length limit; else None."""
    if not explicit & set(LIMIT_KEYS):
        return None
    return Limits(**{k: getattr(policy, k) for k in LIMIT_KEYS if k in explicit})


def _cut_turn(turns: list[TurnGenerated], limits: Limits) -> tuple[int, Outcome] | None:
    """(number of turns kept, outcome) when a limit stops the episode earlier; None otherwise."""
    generated = 0
    for index, turn in enumerate(turns):
        if turn.turn > limits.max_turns:
            return index, Outcome.TRUNCATED_TURNS
        if turn.context_tokens > limits.context_cap:
            return index, Outcome.TRUNCATED_CONTEXT
        generated += len(turn.output_token_ids)
        if generated > limits.max_trajectory_tokens:
            return index, Outcome.TRUNCATED_TOKENS
    return None


def truncate_events(events: Sequence[Event], limits: Limits) -> list[Event]:
    """The episode (complete, in seq order) cut where `limits` would have stopped it."""
    turns = [e.data for e in events if isinstance(e.data, TurnGenerated)]
    cut = _cut_turn(turns, limits)
    if cut is None:
        return list(events)
    kept_turns, outcome = cut
    kept: list[Event] = []
    for event in events:
        if isinstance(event.data, TurnGenerated) and event.data.turn > kept_turns:
            break
        if event.type in ("tests.ran", "sandbox.released", "trajectory.finished"):
            break
        kept.append(event)
    start, last = kept[0], kept[-1]
    assert isinstance(start.data, TrajectoryStarted)
    kept_outputs = [t for t in turns if t.turn <= kept_turns]
    finished = TrajectoryFinished(
        outcome=outcome,
        reward=0.0,
        turns=kept_turns,
        generated_tokens=sum(len(t.output_token_ids) for t in kept_outputs),
        context_tokens=kept_outputs[-1].context_tokens if kept_outputs else len(start.data.prompt_token_ids),
        last_seq=len(kept),
        error=f"replayed under {limits.model_dump()}",
    )
    end = make_event(
        finished,
        run_id=last.run_id,
        seq=len(kept),
        time_ns=last.time_ns,
        source=last.source,
        group_id=last.group_id,
        trajectory_id=last.trajectory_id,
        task_id=last.task_id,
        policy_version=last.policy_version,
        id_key=f"whatif:{last.trajectory_id}",
    )
    return [*kept, end]
