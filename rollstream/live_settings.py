"""`[live]` settings of the live terminal view (kept apart so the config imports nothing heavy)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LiveViewSettings(BaseModel):
    """`[live]`: the live terminal view of a run (`rollstream up`, the demo)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    refresh_s: float = Field(default=1.0, gt=0, description="how often the view is redrawn")
    poll_ms: int = Field(default=500, gt=0, description="longest wait of one read of the run's topics")
    engine_poll_s: float = Field(default=2.0, gt=0, description="how often engines are asked their version")
    engine_timeout_s: float = Field(default=2.0, gt=0, description="an engine slower than this shows as down")
    steps_shown: int = Field(default=5, ge=1, description="trainer steps listed (the latest)")
    seek_attempts: int = Field(
        default=5, ge=1, description="tries to find the run's start on the topics (a leader may be moving)"
    )
