"""`[supervisor]`: restarts, health checks and stopping of the pipeline's processes
(rollstream/supervisor.py). Apart from the supervisor so that the config imports settings only.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SupervisorSettings(BaseModel):
    """`[supervisor]`: restarts, health checks and stopping of the pipeline's processes."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    backoff_s: float = Field(default=1.0, ge=0, description="wait before the first restart of a process")
    backoff_max_s: float = Field(default=30.0, ge=0, description="cap of the doubling restart backoff")
    healthy_after_s: float = Field(
        default=60.0, gt=0, description="a run this long resets the backoff and the consecutive restarts"
    )
    max_restarts: int = Field(
        default=5, ge=0, description="consecutive restarts before a process is given up; 0 = never"
    )
    health_interval_s: float = Field(default=0.5, gt=0, description="how often processes are checked")
    heartbeat_interval_s: float = Field(default=2.0, gt=0, description="how often children beat")
    hung_after_s: float = Field(
        default=60.0, gt=0, description="restart a process whose last heartbeat is older than this"
    )
    startup_grace_s: float = Field(
        default=180.0, gt=0, description="time from start to a process's first heartbeat (imports, model)"
    )
    stop_timeout_s: float = Field(
        default=15.0, gt=0, description="SIGTERM to SIGKILL of each process on stop (one after another)"
    )
