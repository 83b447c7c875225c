"""The deployment configs in `configs/` load, hold what docs/cluster.md ("Running on a cluster") says,
and the commands that page gives for each machine are ones the CLI accepts."""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollstream.cli import app
from rollstream.config import Config, load_config

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "configs" / "cluster.toml"
GPU = ROOT / "configs" / "gpu.toml"
SHARED_SECTIONS = ("run", "kafka", "topics", "db", "client", "policy")


def cluster_section() -> str:
    return (ROOT / "docs" / "cluster.md").read_text()


@pytest.fixture(scope="module")
def cluster() -> Config:
    return load_config(CLUSTER)


@pytest.fixture(scope="module")
def gpu() -> Config:
    return load_config(GPU)


def test_cluster_config_is_three_brokers_postgres_and_remote_sandboxes_and_engines(cluster: Config) -> None:
    assert cluster.kafka.bootstrap == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
    assert (cluster.topics.replication_factor, cluster.topics.min_insync_replicas) == (3, 2)
    assert cluster.db_url == "postgresql+psycopg://rollstream@postgres-1:5432/rollstream"
    assert cluster.sandbox.backend in ("docker", "e2b") and cluster.sandbox.backend == "docker"
    assert cluster.client.urls and not any(
        "127.0.0.1" in url or "localhost" in url for url in cluster.client.urls
    )
    assert cluster.state_dir == Path("/shared/rollstream") and cluster.weights_dir.is_relative_to(
        cluster.state_dir
    )
    assert cluster.tasks_dir.is_relative_to(cluster.state_dir)
    assert not cluster.sandbox.faults.active and cluster.client.faults.engine_error_rate == 0


def test_gpu_config_trains_with_megatron_on_cuda_and_shares_the_cluster_settings(
    cluster: Config, gpu: Config
) -> None:
    assert (gpu.trainer.backend, gpu.trainer.device) == ("megatron", "cuda")
    assert gpu.model_dir.is_relative_to(gpu.state_dir)
    for section in SHARED_SECTIONS:
        assert getattr(gpu, section) == getattr(cluster, section), section


def test_the_cluster_page_states_the_configs_values(cluster: Config, gpu: Config) -> None:
    text = cluster_section()
    assert "configs/cluster.toml" in text and "configs/gpu.toml" in text
    assert f'kafka.bootstrap =\n  "{cluster.kafka.bootstrap}"' in text
    assert f"topics.replication_factor = {cluster.topics.replication_factor}" in text
    assert f"topics.min_insync_replicas = {cluster.topics.min_insync_replicas}" in text
    assert f'run.state_dir = "{cluster.run.state_dir}"' in text
    assert f'db.url = "{cluster.db.url}"' in text
    assert f'sandbox.backend = "{cluster.sandbox.backend}"' in text
    assert (
        f'trainer.backend =\n  "{gpu.trainer.backend}"' in text
        and f'trainer.device = "{gpu.trainer.device}"' in text
    )
    assert f"--model-path {gpu.model.path}" in text
    assert f"--run {gpu.run.name}" in text and f"--context-length {gpu.policy.context_cap}" in text


def test_every_command_of_the_cluster_page_is_accepted_by_the_cli() -> None:
    commands = re.findall(r"`((?:torchrun [^`]*?-m )?rollstream [^`]+)`", cluster_section())
    args = [shlex.split(command.split("rollstream ", 1)[1]) for command in commands]
    names = {a[0] for a in args}
    assert {"worker", "sink", "rollout", "train", "weights", "engine", "topics", "db"} <= names
    runner = CliRunner()
    for argv in args:
        if argv[:2] == ["kafka", "up"]:
            continue  # the one-machine cluster, for reference only
        result = runner.invoke(app, [*argv, "--help"])
        assert result.exit_code == 0, (argv, result.output)
        for config in (value for flag, value in itertools.pairwise(argv) if flag == "--config"):
            load_config(ROOT / config)
