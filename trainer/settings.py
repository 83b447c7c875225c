"""Settings of the policy model (a Llama-shaped decoder sized by config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ModelSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    path: str = Field(default="", description="model directory; empty = <state_dir>/model")
    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 352
    max_position: int = 65536
    rope_theta: float = 10000.0
    seed: int = 0
