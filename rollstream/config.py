"""The one config: `rollstream.toml` (every key optional) read into typed, frozen models.

Each layer owns its settings models (`streams.settings`, `sandboxes.settings`,
`agents.settings`, `trainer.settings`); this module composes them, reads the TOML
file, applies `--set section.key=value` overrides (values parsed as TOML, so
`policy.max_turns=40` is an int) and reports mistakes with the key at fault.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agents.settings import (
    AgentSettings,
    ClientSettings,
    EngineSettings,
    EvalSettings,
    ExpertSettings,
    FollowSettings,
    GatewaySettings,
    RolloutSettings,
)
from rollstream.chaos_settings import ChaosSettings
from rollstream.live_settings import LiveViewSettings
from rollstream.report.settings import ReportSettings
from rollstream.supervisor_settings import SupervisorSettings
from sandboxes.settings import SandboxSettings, TaskSettings
from streams.monitor.settings import MonitorSettings
from streams.settings import (
    KafkaSettings,
    PolicySettings,
    StoreSettings,
    StreamWorkerSettings,
    TopicSettings,
)
from trainer.settings import ModelSettings, ModelSourceSettings, TrainerSettings

DEFAULT_CONFIG_FILE = Path("rollstream.toml")


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RunSettings(Frozen):
    name: str = Field(default="", description="run id; empty = generated at submit time")
    state_dir: str = ".rollstream"


class BrokerSettings(Frozen):
    """The local Kafka broker started by `rollstream kafka up`."""

    version: str = Field(default="4.4.0", description="org.apache.kafka:kafka_2.13 from Maven Central")
    port: int = 19092
    controller_port: int = 19093
    heap_mb: int = 512
    cluster_ports: tuple[int, int, int] = (19192, 19292, 19392)
    cluster_controller_ports: tuple[int, int, int] = (19193, 19293, 19393)
    startup_timeout_s: float = 120.0
    stop_timeout_s: float = 30.0
    message_max_bytes: int = Field(default=10_485_760, description="broker limit; > kafka.max_request_size")
    offsets_partitions: int = Field(default=10, description="__consumer_offsets partitions")
    jar_fetch_timeout_s: float = 600.0
    port_release_s: float = Field(default=10.0, description="wait this long for a port to free up")


class PostgresSettings(Frozen):
    """The local PostgreSQL server started by `rollstream postgres up`."""

    port: int = 15432
    user: str = "rollstream"
    database: str = "rollstream"
    bin_dir: str = Field(default="", description="server binaries; empty = newest /usr/lib/postgresql/*/bin")
    system_user: str = Field(default="postgres", description="runs the server when we are root")
    startup_timeout_s: float = 60.0


class LearningSettings(Frozen):
    """Base -> SFT -> RL on the learning task family (`rollstream bench learning`, the demo)."""

    seed: int = Field(default=0, description="tasks, base model init and the expert's choices")
    base_model: str = Field(
        default="",
        description="a pretrained model to start from (directory or known name, e.g. smollm2-135m-instruct); "
        "empty: a small random model initialised per seed",
    )
    train_tasks: int = Field(default=128, ge=1, description="tasks of the train split (expert, RL)")
    heldout_tasks: int = Field(default=32, ge=1, description="tasks of the held-out split (evaluation only)")
    expert_groups_per_task: int = Field(default=1, ge=1, description="expert groups per train task (SFT)")
    sft_epochs: int = Field(default=4, ge=1)
    rl_steps: int = Field(default=50, ge=1, description="trainer steps of the RL phase (bench learning)")
    retire_solved_tasks: bool = Field(
        default=True, description="a train task one group solved in every attempt sits out of RL's feed"
    )
    retired_return_rounds: int = Field(
        default=0,
        ge=0,
        description="rounds of the train split a solved task sits out, doubled each "
        "further time it is solved; 0: for good (1 on seed 2 cost 64% more groups and gained nothing)",
    )
    end_when_train_solved: bool = Field(
        default=True,
        description="end RL before rl_steps once every train task sits out, solved by a "
        "whole group: what is left are zero-variance groups (seed 2: ~1 min a step against ~20 s)",
    )
    rl_groups_ahead: int = Field(
        default=12, ge=1, description="groups requested beyond those formed (bounds staleness and waste)"
    )
    phase_timeout_s: float = Field(default=1200.0, gt=0, description="longest wait for one phase")


class Config(Frozen):
    run: RunSettings = RunSettings()
    kafka: KafkaSettings = KafkaSettings()
    broker: BrokerSettings = BrokerSettings()
    topics: TopicSettings = TopicSettings()
    db: StoreSettings = StoreSettings()
    postgres: PostgresSettings = PostgresSettings()
    policy: PolicySettings = PolicySettings()
    streams: StreamWorkerSettings = StreamWorkerSettings()
    model: ModelSettings = ModelSettings()
    model_sources: ModelSourceSettings = ModelSourceSettings()
    engine: EngineSettings = EngineSettings()
    client: ClientSettings = ClientSettings()
    follow: FollowSettings = FollowSettings()
    agent: AgentSettings = AgentSettings()
    gateway: GatewaySettings = GatewaySettings()
    rollout: RolloutSettings = RolloutSettings()
    expert: ExpertSettings = ExpertSettings()
    eval: EvalSettings = EvalSettings()
    learning: LearningSettings = LearningSettings()
    chaos: ChaosSettings = ChaosSettings()
    sandbox: SandboxSettings = SandboxSettings()
    tasks: TaskSettings = TaskSettings()
    trainer: TrainerSettings = TrainerSettings()
    monitor: MonitorSettings = MonitorSettings()
    report: ReportSettings = ReportSettings()
    supervisor: SupervisorSettings = SupervisorSettings()
    live: LiveViewSettings = LiveViewSettings()

    @property
    def state_dir(self) -> Path:
        return Path(self.run.state_dir)

    @property
    def db_url(self) -> str:
        return self.db.url or f"sqlite:///{self.state_dir / 'events.db'}"

    @property
    def model_dir(self) -> Path:
        return Path(self.model.path) if self.model.path else self.state_dir / "model"

    @property
    def weights_dir(self) -> Path:
        """Published weight versions: `<weights_dir>/<run>/<version>/`."""
        return self.state_dir / "weights"

    @property
    def tasks_dir(self) -> Path:
        return Path(self.tasks.root) if self.tasks.root else self.state_dir / "tasks" / "default"

    def with_overrides(self, overrides: list[str]) -> Config:
        return build_config(self.model_dump(mode="python"), overrides)


class ConfigError(ValueError):
    """A config file or override that cannot be used; the message says which key and why."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """`policy.max_turns=40` -> (['policy', 'max_turns'], 40). Values are TOML; bare words are strings."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not KEY=VALUE (for example policy.max_turns=40)")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return key.strip().split("."), parsed


def _apply(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {'.'.join(path)}: {part} is not a section")
        node = child
    node[path[-1]] = value


def build_config(tree: dict[str, Any], overrides: list[str] | None = None) -> Config:
    tree = _deep_copy(tree)
    for text in overrides or []:
        path, value = parse_override(text)
        _apply(tree, path, value)
    try:
        return Config.model_validate(tree)
    except ValidationError as error:
        lines = []
        for item in error.errors():
            where = ".".join(str(p) for p in item["loc"])
            lines.append(f"  {where}: {item['msg']}")
        raise ConfigError("invalid config:\n" + "\n".join(lines)) from None


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read `path` (default `rollstream.toml` when it exists) and apply overrides."""
    file = path or DEFAULT_CONFIG_FILE
    tree: dict[str, Any] = {}
    if path is not None and not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    if file.exists():
        try:
            tree = tomllib.loads(file.read_text())
        except tomllib.TOMLDecodeError as error:
            raise ConfigError(f"{file} is not valid TOML: {error}") from None
    return build_config(tree, overrides)


def _deep_copy(tree: dict[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, dict) else v for k, v in tree.items()}
