"""Settings of the sandboxes layer: backend, limits, pool caps, tasks.

Every cap is a named setting; the pool records how long callers wait on each.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LimitSettings(Frozen):
    """Per-command and per-sandbox resource limits."""

    command_timeout_s: float = 180.0
    cpu_time_s: int = 600
    memory_mb: int = 2048
    max_processes: int = 256
    output_limit_bytes: int = 1_000_000


class PoolSettings(Frozen):
    max_running: int = Field(default=512, description="sandboxes alive at once, per backend")
    max_starting: int = Field(default=64, description="starts in flight")
    starts_per_s: float = Field(default=0.0, description="0 = unlimited")
    image_pulls_per_h: int = Field(default=100, description="docker: pulls allowed per hour")
    warm_pool: int = Field(default=0, description="sandboxes started ahead for the next episodes")
    start_timeout_s: float = 60.0


class DockerSettings(Frozen):
    base_url: str = Field(default="", description="docker API socket; empty = DOCKER_HOST or podman's")
    image: str = "rollstream-sandbox:latest"
    network: Literal["none", "shared-internal"] = "none"
    label: str = "rollstream.sandbox"


class E2BSettings(Frozen):
    template: str = "base"
    timeout_s: int = 3600
    request_timeout_s: float = 30.0
    api_key_env: str = Field(default="E2B_API_KEY", description="environment variable holding the key")


class SandboxSettings(Frozen):
    backend: Literal["bwrap", "docker", "e2b", "simulated"] = "bwrap"
    limits: LimitSettings = LimitSettings()
    pool: PoolSettings = PoolSettings()
    docker: DockerSettings = DockerSettings()
    e2b: E2BSettings = E2BSettings()


class TaskSettings(Frozen):
    root: str = Field(default="", description="task set directory; empty = <state_dir>/tasks/default")
    verifier_timeout_s: float = 300.0
