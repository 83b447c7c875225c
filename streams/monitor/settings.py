"""Settings of the monitor (`[monitor]` in the one TOML config).

Window sizes, histogram buckets and the bounds on label cardinality are all here;
`rollstream.config` composes this model as `monitor`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class MonitorSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    app_id: str = Field(default="rollstream-monitor", description="faust app id (topic prefix is prepended)")
    host: str = Field(default="127.0.0.1", description="address faust's web server binds to")
    port: int = Field(default=19400, ge=0, le=65535, description="port of /metrics (0 = any free port)")
    state_dir: str = Field(default="", description="faust data dir; empty = <run.state_dir>/monitor")
    tumbling_s: float = Field(default=60.0, gt=0, description="tumbling window size (per-minute figures)")
    hopping_s: float = Field(default=600.0, gt=0, description="hopping window size")
    hopping_step_s: float = Field(default=60.0, gt=0, description="hopping window step")
    window_expires_s: float = Field(default=3600.0, gt=0, description="windows older than this are dropped")
    commit_interval_s: float = Field(default=1.0, gt=0, description="faust offset commit interval")
    session_timeout_s: float = Field(
        default=10.0, ge=6, description="consumer session timeout: when a killed monitor's partitions move"
    )
    batch_max_records: int = Field(default=2000, ge=1, description="records folded per table write")
    batch_within_s: float = Field(
        default=0.2, gt=0, description="longest wait to fill a batch (adds at most this to the lag)"
    )
    latency_buckets_s: tuple[float, ...] = Field(
        default=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
        description="histogram bucket bounds (seconds) for sandbox start, queue waits, durations",
    )
    versions_kept: int = Field(
        default=20, ge=1, description="weight versions kept for per-version figures (reward, pass, tail)"
    )
    tail_spans_kept: int = Field(
        default=4096, ge=1, description="trajectories per version and partition kept for the tail share"
    )
    tail_fraction: float = Field(
        default=0.9, gt=0, lt=1, description="tail share = rollout time after this fraction finished"
    )
