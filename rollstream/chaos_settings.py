"""`[chaos]`: sizes, kill schedule and fault rates of `rollstream bench chaos` (bench/chaos.py)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ChaosSettings(BaseModel):
    """A training run on three brokers with every process SIGKILLed on a seeded schedule."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    seed: int = Field(default=0, description="the kill schedule, the broker killed and the fault draws")
    task_seed: int = Field(default=7, description="learning-family tasks and base model (learning.seed)")
    train_tasks: int = Field(default=16, ge=1, description="tasks of the family's train split")
    rl_steps: int = Field(default=8, ge=1, description="trainer steps (the run ends when the trainer does)")
    groups_per_step: int = Field(default=3, ge=1, description="trainer.groups_per_step during the run")
    groups_ahead: int = Field(default=4, ge=1, description="groups requested beyond those trained or dropped")
    kills_each: int = Field(
        default=2, ge=0, description="SIGKILLs of each of sink, worker, rollout, trainer, engine"
    )
    schedule_start: float = Field(
        default=0.1, ge=0, lt=1, description="first kill, as a fraction of progress"
    )
    schedule_end: float = Field(default=0.8, gt=0, le=1, description="last kill, as a fraction of progress")
    min_kill_gap_s: float = Field(
        default=10.0, ge=0, description="at least this long between two kills (progress comes in bursts)"
    )
    broker_down_s: float = Field(default=20.0, ge=0, description="a killed broker is restarted after this")
    fault_rate: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="sandbox start failures, hangs and engine 5xx, each at this rate",
    )
    drain_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="after the trainer's last step, wait this long for every request to finish",
    )
    sink_timeout_s: float = Field(default=180.0, gt=0, description="wait this long for the sink to catch up")
    run_timeout_s: float = Field(default=2400.0, gt=0, description="longest wait for the trainer's last step")
