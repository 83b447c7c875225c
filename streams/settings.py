"""Settings of the streams layer: broker connection, topics, event store, policies, worker.

Defaults are the reference run's (DESIGN.md). `rollstream.config` composes these
into the one TOML config; nothing here reads files or the environment.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(Frozen):
    bootstrap: str = "127.0.0.1:19092"
    client_id: str = "rollstream"
    linger_ms: int = 5
    max_batch_size: int = 1_048_576
    max_request_size: int = 8_388_608
    compression: Literal["zstd", "gzip", "lz4", "none"] = "zstd"
    request_timeout_ms: int = 40_000
    max_block_ms: int = Field(
        default=120_000,
        gt=0,
        description="producer: how long a send may wait for room in a partition's queue while the broker "
        "is slow to ack (Kafka's max.block.ms) before it fails with BusError",
    )
    fetch_max_bytes: int = Field(default=52_428_800, description="consumer: most bytes per fetch")
    max_partition_fetch_bytes: int = Field(default=10_485_760, description="consumer: per partition")
    producer_batch_records: int = Field(
        default=2000, description="EventProducer hands records to aiokafka in batches of at most this many"
    )


class TopicSettings(Frozen):
    prefix: str = Field(default="", description="prepended to every topic name (tests use a unique one)")
    replication_factor: int = 1
    min_insync_replicas: int = 1
    rollout_events_partitions: int = 6
    trajectories_partitions: int = 6
    groups_partitions: int = 3
    rollout_requests_partitions: int = 12
    rollout_control_partitions: int = 1
    weights_partitions: int = 1
    trainer_steps_partitions: int = 1
    deadletter_partitions: int = 1
    max_message_bytes: int = Field(default=10_485_760, description="topic max.message.bytes")
    create_timeout_s: float = 60.0


class StoreSettings(Frozen):
    url: str = Field(default="", description="SQLAlchemy URL; empty = SQLite at <state_dir>/events.db")
    sink_batch_size: int = 2000
    sink_group: str = "rollstream-sink"
    sink_topics: tuple[str, ...] = ("rollout.events", "weights.history", "trainer.steps", "groups")
    sink_poll_ms: int = Field(default=500, description="longest wait for records before an idle check")
    sink_gil_switch_ms: float = Field(
        default=0.5,
        gt=0,
        description="Python's thread switch interval while the sink runs (sys.setswitchinterval; Python's "
        "default is 5 ms): how long its commit thread may wait for the GIL behind the decoding loop "
        "each time an SQL statement returns",
    )
    sqlite_cache_mib: int = Field(
        default=64,
        ge=1,
        description="SQLite page cache of a writing connection (PRAGMA cache_size): a sink batch's pages "
        "fit, so none is spilled and written twice, and index pages are not re-read from the file",
    )


class PolicySettings(Frozen):
    """Length, failure and staleness policies; recorded on every trajectory and group."""

    max_turns: int = 80
    max_new_tokens_per_turn: int = 8192
    max_trajectory_tokens: int = 65536
    context_cap: int = 65536
    tool_output_chars: int = 10000
    group_size: int = 8
    infra_error_retries: int = 2
    min_valid_attempts: int = 2
    group_deadline_s: float = Field(default=0.0, description="0 = no deadline")
    drop_zero_variance: bool = True
    max_staleness: int = Field(default=4, description="weight versions; -1 = unlimited")
    overlong: Literal["mask", "drop", "zero"] = "mask"
    normalise_std: bool = True
    advantage_eps: float = Field(default=1e-6, description="added to the group std before dividing")
    abort_grace_s: float = Field(
        default=60.0,
        description="after the deadline's aborts, wait this long for stragglers, then form without them",
    )


class StreamWorkerSettings(Frozen):
    group_id: str = "rollstream-streams"
    commit_interval_s: float = 1.0
    deadline_check_interval_s: float = 0.5
    batch_max_records: int = 5000
    batch_timeout_ms: int = 200
    closed_groups_memory: int = Field(
        default=200_000, description="group ids remembered after emission, to ignore late duplicates"
    )
    readback_idle_s: float = Field(
        default=1.0, description="longest wait of one fetch while reading back own output at start"
    )
