"""The `trainer.steps` payload of one step, RL or SFT, from its metrics and what the loop counted
(the RL loop in trainer/loop.py, SFT in trainer/sft.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from streams.payloads import StepTimes, TrainerStep
from trainer.intake import STALE, ZERO_VARIANCE
from trainer.step import StepMetrics
from trainer.waits import WaitSplit

NO_WAIT = WaitSplit(wait_s=0.0, groups_s=0.0, trajectories_s=0.0, cpu_busy=None)  # SFT reads no log


def step_times(metrics: StepMetrics, publish_s: float, wait: WaitSplit = NO_WAIT) -> StepTimes:
    """A step's time split: the wait before it, its logprobs and update, and what publishing cost
    its path (`total_s` is their sum; a version written in the background is not in it)."""
    return StepTimes(
        wait_s=wait.wait_s,
        wait_groups_s=wait.groups_s,
        wait_trajectories_s=wait.trajectories_s,
        wait_cpu_busy=wait.cpu_busy,
        logprob_s=metrics.logprob_s,
        update_s=metrics.update_s,
        comm_s=metrics.comm_s,
        publish_s=publish_s,
        total_s=wait.wait_s + metrics.logprob_s + metrics.update_s + publish_s,
    )


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
