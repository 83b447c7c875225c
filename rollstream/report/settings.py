"""Settings of the run report (`[report]` in rollstream.toml): figure sizes, bins, the tail mark."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ReportSettings(BaseModel):
    """How `rollstream report` draws its figures; what it shows comes from the SQL store."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    dpi: int = Field(default=100, ge=30, le=400, description="PNG resolution (dots per inch)")
    figure_width_in: float = Field(default=8.0, gt=0, description="width of every figure, inches")
    figure_height_in: float = Field(default=3.4, gt=0, description="height of a one-panel figure, inches")
    max_turn_bins: int = Field(
        default=40,
        ge=1,
        description="turns histogram: one bar per turn count up to this many, wider bins beyond",
    )
    wait_bins: int = Field(default=30, ge=1, description="bins of the sandbox cap wait histogram")
    max_step_bars: int = Field(
        default=200, ge=1, description="trainer-step time breakdown: the last this many steps as bars"
    )
    finished_fraction: float = Field(
        default=0.9,
        gt=0,
        lt=1,
        description="the long-tail mark: share of trajectories finished (the reference run's 90%)",
    )
