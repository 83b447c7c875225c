"""The three length controls of an episode, as pure functions of its counters.

- max turns (`Limits.max_turns`): the number of model calls;
- max new tokens per turn (`max_new_tokens_per_turn`): each call's budget;
- max generated tokens per trajectory (`max_trajectory_tokens`): the sum over calls;

and, before each call, the context (prompt + everything appended) is checked
against the engine's context cap (`context_cap`). The control that ends the
episode is its outcome: `truncated:turns|tokens|context`.
"""

from __future__ import annotations

from dataclasses import dataclass

from streams.outcomes import Outcome
from streams.payloads import Limits


@dataclass(frozen=True)
class CallBudget:
    """What the next call may do: `stop` is set when no call may be made at all."""

    stop: Outcome | None
    max_new_tokens: int
    bound_by: Outcome | None  # the control that sets max_new_tokens, when not the per-turn cap


def next_call_budget(limits: Limits, turns_done: int, generated: int, context: int) -> CallBudget:
    """Checked before every model call."""
    if turns_done >= limits.max_turns:
        return CallBudget(Outcome.TRUNCATED_TURNS, 0, None)
    left_tokens = limits.max_trajectory_tokens - generated
    if left_tokens <= 0:
        return CallBudget(Outcome.TRUNCATED_TOKENS, 0, None)
    left_context = limits.context_cap - context
    if left_context <= 0:
        return CallBudget(Outcome.TRUNCATED_CONTEXT, 0, None)
    budget = min(limits.max_new_tokens_per_turn, left_tokens, left_context)
    bound_by = None
    if budget == left_tokens and left_tokens < limits.max_new_tokens_per_turn:
        bound_by = Outcome.TRUNCATED_TOKENS
    elif budget == left_context and left_context < limits.max_new_tokens_per_turn:
        bound_by = Outcome.TRUNCATED_CONTEXT
    return CallBudget(None, budget, bound_by)


def stop_after_call(budget: CallBudget, produced: int, finish_reason: str) -> Outcome | None:
    """The outcome when a call used up a trajectory-level budget (tokens or context)."""
    if budget.bound_by is not None and finish_reason == "length" and produced >= budget.max_new_tokens:
        return budget.bound_by
    return None
