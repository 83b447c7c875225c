"""Settings of the agents layer: embedded engine, engine client, scaffold, rollout worker."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EngineSettings(Frozen):
    """The embedded torch engine (SGLang's HTTP contract)."""

    host: str = "127.0.0.1"
    port: int = 30000
    context_length: int = Field(default=65536, description="engine-side context cap")
    max_running_requests: int = 64
    max_queued_requests: int = 4096
    kv_cache_tokens: int = Field(default=262144, description="tokens of KV cache across running requests")
    prefill_chunk_tokens: int = Field(
        default=2048, ge=1, description="prompt tokens prefilled per scheduler step (chunked prefill)"
    )
    prefix_cache_tokens: int = Field(
        default=131072, ge=0, description="tokens of finished requests' KV kept for reuse; 0 = off"
    )
    prefix_block_tokens: int = Field(default=64, ge=1, description="prefix cache match granularity")
    torch_threads: int = Field(default=0, ge=0, description="torch intra-op threads; 0 = torch's default")
    dtype: Literal["float32", "bfloat16"] = Field(
        default="float32", description="weights and KV cache; bfloat16 is ~2x faster on CPU for real models"
    )
    health_timeout_s: float = Field(default=20.0, description="/health_generate's one-token generation")
    seed: int = 0


class FollowSettings(Frozen):
    """Engines following the `weights` topic (`rollstream engine serve --follow-weights RUN`,
    `rollstream weights follow`). Which versions they load is `trainer.sync_every`."""

    poll_ms: int = Field(default=500, ge=1, description="longest wait for new `weights` records in one poll")
    retry_s: float = Field(
        default=5.0, gt=0, description="wait before retrying an engine that could not be reached or load"
    )
    load_timeout_s: float = Field(
        default=600.0, gt=0, description="one /update_weights_from_disk call (large models load for minutes)"
    )


class ClientFaultSettings(Frozen):
    """Faults injected into the real engine client (`agents/engine/faults.py`); 0 = off, the default."""

    engine_error_rate: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="fraction of /generate attempts answered 5xx (kind engine; retried per client.retries)",
    )
    seed: int = Field(default=0, description="seed of the fault draws: the same requests get the same faults")


class ClientSettings(Frozen):
    """The engine client: routing, pool and retries. No hidden caps."""

    urls: tuple[str, ...] = ("http://127.0.0.1:30000",)
    max_connections: int = Field(default=4096, description="HTTP connection pool size")
    max_in_flight: int = Field(default=4096, description="requests in flight across engines")
    timeout_s: float = 600.0
    connect_timeout_s: float = 10.0
    retries: int = 3
    retry_backoff_s: float = 0.5
    faults: ClientFaultSettings = ClientFaultSettings()


class MiniSweSettings(Frozen):
    """mini-swe-agent as the scaffold (`agent.scaffold = "mini-swe-agent"`), run unmodified: these
    are settings passed to it through its own config and environment variables."""

    config: str = Field(
        default="mini.yaml",
        description="its agent config: a file name among its built-in configs (mini.yaml is what its "
        "`mini` command uses) or a path to a YAML file",
    )
    model_retries: int = Field(
        default=2, ge=1, description="its model call attempts (MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT)"
    )
    state_dir: str = Field(
        default="",
        description="its global config directory (MSWEA_GLOBAL_CONFIG_DIR); empty: <state_dir>/mini",
    )


class AgentSettings(Frozen):
    """The agent: our bash scaffold (mini-swe-agent style) or an OpenAI-speaking one behind the gateway."""

    scaffold: Literal["bash", "mini-swe-agent"] = Field(
        default="bash",
        description="bash: our scaffold, token ids to the engine; mini-swe-agent: unmodified mini-swe-agent "
        "2.x through the session gateway (pip install rollstream[mini])",
    )
    mini: MiniSweSettings = MiniSweSettings()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_format_errors: int = Field(default=3, ge=1, description="format errors in a row that end the episode")
    submit_command: str = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    shell: str = Field(default="bash", description="each command runs as `<shell> -c <command>`")


class GatewaySettings(Frozen):
    """The session gateway: OpenAI's chat completions in front of the engines (`agents/gateway/`)."""

    host: str = Field(default="127.0.0.1", description="loopback unless configured otherwise")
    port: int = Field(default=0, ge=0, description="0: a free port (the rollout worker's own gateway)")
    model_name: str = Field(default="", description="the served model's name; empty: its directory's name")
    admin_token_env: str = Field(
        default="ROLLSTREAM_GATEWAY_TOKEN",
        description="environment variable holding the token that opens and closes sessions over HTTP "
        "(`rollstream gateway serve`); unset: a new token is written to <state_dir>/gateway.token",
    )
    session_timeout_s: float = Field(
        default=1800.0, gt=0, description="a session opened over HTTP without a timeout ends after this long"
    )
    ended_sessions_kept: int = Field(
        default=4096, ge=0, description="ended sessions remembered, so a late call hears why (403), not 404"
    )
    max_request_mb: int = Field(default=64, ge=1, description="largest request body accepted")


class ExpertSettings(Frozen):
    """The learning family's scripted expert (`rollstream rollout --policy expert`), whose resolved
    traces are the SFT data: imperfect on purpose, as other agents' public traces are."""

    test_first_rate: float = Field(
        default=0.15,
        ge=0,
        le=1,
        description="first turn runs the tests; otherwise it guesses a fix blind "
        "(0.3 made reading first 63% of the resolved traces, and one SFT model of seed 2 reached 0.875)",
    )
    right_edit_rate: float = Field(
        default=0.9, ge=0, le=1, description="after reading the tests, picks the fix the shown line calls for"
    )
    seed: int = 0


class EvalSettings(Frozen):
    """`rollstream eval`: pass@1 over k attempts per task, infrastructure errors re-run."""

    attempts: int = Field(default=4, ge=1, description="attempts per task (pass@1 = mean success)")
    max_infra_reruns: int = Field(
        default=3, ge=0, description="re-runs of an attempt that ended in an infra error; never scored"
    )
    concurrency: int = Field(default=32, ge=1, description="episodes at once")
    engine_start_timeout_s: float = Field(default=180.0, gt=0, description="wait for the eval's engine")


class RolloutSettings(Frozen):
    """The rollout worker: episodes at once, its consumer group and its commit cadence."""

    concurrency: int = Field(default=384, ge=1, description="episodes one worker runs at once")
    consumer_group: str = "rollstream-rollout"
    request_poll_ms: int = 200
    commit_interval_s: float = Field(default=1.0, gt=0, description="commit finished requests this often")
    keepalive_s: float = Field(default=5.0, gt=0, description="poll interval while every slot is busy")
    drain_timeout_s: float = Field(
        default=10.0,
        ge=0,
        le=240,  # no poll while draining: stay well inside aiokafka's 300 s max poll interval
        description="on SIGTERM, how long in-flight episodes may finish before the worker exits; fits the "
        "pipeline supervisor's 15 s TERM-to-KILL window with time left to commit and leave the group",
    )
    finished_lookback_s: float = Field(
        default=60.0,
        ge=0,
        description="on taking over request partitions, read finished trajectories from this long before the "
        "oldest request handed over (clock skew between machines), so a finished one is not run again",
    )
