"""The `trainer.steps` payload of one step, RL or SFT, from its metrics and what the loop counted
(the RL loop in trainer/loop.py, SFT in trainer/sft.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from streams.payloads import StepTimes, TrainerStep
from trainer.intake import STALE, ZERO_VARIANCE
from trainer.step import StepMetrics


def step_payload(
    metrics: StepMetrics,
    *,
    step: int,
    version: int,
    group_ids: Sequence[str],
    seen: Counter[str],
    staleness_mean: float,
    staleness_max: int,
    times: StepTimes,
    mode: str = "rl",
) -> TrainerStep:
    """The `trainer.steps` payload of one step (schema v2)."""
    return TrainerStep(
        step=step,
        version=version,
        mode=mode,
        groups=len(group_ids),
        trajectories=metrics.trajectories,
        group_ids=list(group_ids),
        loss=metrics.loss,
        grad_norm=metrics.grad_norm,
        clip_frac_low=metrics.clip_frac_low,
        clip_frac_high=metrics.clip_frac_high,
        entropy=metrics.entropy,
        mean_logprob_diff=metrics.mean_logprob_diff,
        ess=metrics.ess,
        ess_seq=metrics.ess_seq,
        reward_mean=metrics.reward_mean,
        zero_variance_groups=seen[ZERO_VARIANCE],
        stale_groups=seen[STALE],
        staleness_mean=staleness_mean,
        staleness_max=staleness_max,
        tokens=metrics.tokens,
        times=times,
    )
