"""Launcher behaviour that needs no second broker: the running single broker answers and
`up` on it is harmless; clear errors for a taken port, a foreign data dir, bad --brokers."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollstream.commands.kafka import app as kafka_app
from rollstream.config import Config, load_config
from rollstream.launcher import kafka, kafka_files
from rollstream.launcher.process import FREE_PORT_MIN, LauncherError, clear_stale, free_port, live_pid


def test_up_on_a_running_broker_is_harmless(kafka_bootstrap: str, base_config: Config) -> None:
    before = kafka.status(base_config)
    assert kafka.ensure_up(base_config) == kafka_bootstrap
    assert kafka.status(base_config) == before
    assert kafka.is_up(base_config)
    result = CliRunner().invoke(kafka_app, ["status"])
    assert result.exit_code == 0, result.output


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_taken_port_is_a_clear_error(tmp_path: Path, taken_port: int) -> None:
    ports = [f"broker.port={taken_port}", f"broker.controller_port={taken_port}", "broker.port_release_s=0.5"]
    config = load_config(None, [f'run.state_dir="{tmp_path}"', *ports])
    with pytest.raises(LauncherError, match=f"port {taken_port} .* is taken"):
        kafka.ensure_up(config)


def test_data_dir_of_another_cluster_is_a_clear_error(tmp_path: Path, base_config: Config) -> None:
    setup = kafka_files.layout(tmp_path, base_config.broker, 1)
    [node] = setup.nodes
    node.data_dir.mkdir(parents=True)
    meta = "version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=1\n"
    (node.data_dir / "meta.properties").write_text(meta)
    setup.cluster_id_file.write_text("BBBBBBBBBBBBBBBBBBBBBB\n")
    with pytest.raises(LauncherError, match="belongs to Kafka cluster AAAAAAAAAAAAAAAAAAAAAA"):
        kafka_files.cluster_id(setup)
    setup.cluster_id_file.unlink()  # without a recorded id the formatted one is adopted
    assert kafka_files.cluster_id(setup) == "AAAAAAAAAAAAAAAAAAAAAA"


def test_unsupported_broker_count_is_rejected(base_config: Config) -> None:
    with pytest.raises(LauncherError, match="--brokers 2"):
        kafka.ensure_up(base_config, brokers=2)


def test_stale_pid_files_are_recognised(tmp_path: Path) -> None:
    pid_file = tmp_path / "kafka.pid"
    pid_file.write_text("999999999\n")  # no such process
    assert live_pid(pid_file, "kafka.Kafka") is None
    assert clear_stale(pid_file, "kafka.Kafka") and not pid_file.exists()
    pid_file.write_text("1\n")  # alive, but not a broker
    assert clear_stale(pid_file, "kafka.Kafka /nowhere/server.properties")
    pid_file.write_text("garbage\n")
    assert clear_stale(pid_file, "kafka.Kafka")


def test_no_broker_answers_on_a_closed_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    assert kafka.broker_count(f"127.0.0.1:{port}") == 0


def test_missing_java_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(LauncherError, match="Java is not installed"):
        kafka_files.check_java()


def test_unknown_kafka_version_is_a_clear_error(tmp_path: Path) -> None:
    config = load_config(None, [f'run.state_dir="{tmp_path}"', 'broker.version="0.0.1-nope"'])
    with pytest.raises(LauncherError, match=r"Maven Central has no .*0\.0\.1-nope"):
        kafka_files.ensure_jars(config.state_dir, config.broker)
    assert not kafka_files.libs_dir(config.state_dir).exists()


def test_cluster_ids_never_look_like_options() -> None:
    ids = {kafka_files.new_cluster_id() for _ in range(3000)}  # ~47 would start with '-' if unchecked
    assert len(ids) == 3000
    assert not any(cid.startswith("-") for cid in ids)
    assert all(len(cid) == 22 for cid in ids)


def test_free_ports_lie_below_the_ephemeral_range_and_are_bindable() -> None:
    """An ephemeral port can be handed to any outgoing connection before our server binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40, "picks are random, not one port walked from a fixed start"
    for port in ports:
        assert FREE_PORT_MIN <= port < low and not 30000 <= port < 30100
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if the port were taken


def test_running_stops_the_broker_only_when_it_started_it(tmp_path: Path, base_config: Config) -> None:
    """A benchmark stops what it started (`bench chaos`, the cluster) and leaves what it found."""
    libs = kafka_files.ensure_jars(base_config.state_dir, base_config.broker)  # fetched once, shared
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "libs").symlink_to(libs)
    ports = [f"broker.port={free_port()}", f"broker.controller_port={free_port()}"]
    config = load_config(None, [f'run.state_dir="{tmp_path}"', *ports])
    assert not kafka.is_up(config)
    with kafka.running(config) as bootstrap:
        [node] = kafka.status(config)
        assert node.answers and node.pid is not None and bootstrap.endswith(f":{node.port}")
        with kafka.running(config):  # found running: left running
            pass
        assert kafka.is_up(config) and kafka.status(config)[0].pid == node.pid
    assert not kafka.is_up(config) and kafka.status(config)[0].pid is None
