"""The local Apache Kafka broker: `ensure_up(config) -> bootstrap`, `is_up`, `down`, `status`,
and `running(config)`, the broker up for a block and stopped after it if the block started it.

`ensure_up` is idempotent and serialised by a file lock: nodes already running
(recognised by pid file and command line) are left alone, a stale pid file is
removed, missing jars are fetched, storage is formatted once, and it returns only
when a metadata request answers with every node of the setup. `brokers=3` starts
the three-node KRaft cluster on `broker.cluster_ports` (replication factor 3,
`min.insync.replicas=2`; see `cluster_overrides`). Nodes run in their own session
and log to `<state_dir>/kafka/<setup>/`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rollstream.config import Config
from rollstream.launcher import kafka_files
from rollstream.launcher.kafka_files import Layout, Node
from rollstream.launcher.process import (
    LauncherError,
    clear_stale,
    is_running,
    kill_now,
    live_pid,
    log_tail,
    port_in_use,
    read_pid,
    start_detached,
    stop_processes,
)
from sandboxes.file_lock import file_lock

logger = logging.getLogger(__name__)

__all__ = [
    "LauncherError",
    "NodeStatus",
    "cluster_overrides",
    "down",
    "ensure_up",
    "is_up",
    "running",
    "status",
]


@dataclass(frozen=True)
class NodeStatus:
    node_id: int
    port: int
    pid: int | None
    answers: bool
    dir: str


def _setup(config: Config, brokers: int) -> Layout:
    return kafka_files.layout(config.state_dir, config.broker, brokers)


def _marker(node: Node) -> str:
    """Text in a node's command line that identifies it (its own properties file)."""
    return str(node.properties)


def broker_count(bootstrap: str, timeout_s: float = 5.0) -> int:
    """How many brokers a metadata request at `bootstrap` reports; 0 when none answers."""

    async def probe() -> int:
        from aiokafka.client import AIOKafkaClient

        client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
        try:
            await asyncio.wait_for(client.bootstrap(), timeout_s)
            return len(client.cluster.brokers())
        except Exception:
            return 0
        finally:
            await client.close()

    if not any(port_in_use(int(hp.rpartition(":")[2])) for hp in bootstrap.split(",")):
        return 0
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        # A thread of its own: callers may already be inside an event loop.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, probe()).result()
    finally:
        quiet.setLevel(level)


def points_at_local_broker(config: Config) -> bool:
    """Whether `kafka.bootstrap` is the broker `ensure_up` would start (not a remote cluster)."""
    return config.kafka.bootstrap == f"127.0.0.1:{config.broker.port}"


def ensure_up(config: Config, brokers: int = 1) -> str:
    """Start the broker (or cluster) unless it runs; return the bootstrap address."""
    setup = _setup(config, brokers)
    with file_lock(setup.root.parent / f"{setup.root.name}.lock"):
        for node in setup.nodes:
            if clear_stale(node.pid_file, _marker(node)):
                logger.warning("removed stale pid file %s (its broker is gone)", node.pid_file)
        to_start = [node for node in setup.nodes if not node.pid_file.exists()]
        if to_start and brokers == 1 and broker_count(setup.bootstrap) >= 1:
            return setup.bootstrap  # a broker this state dir did not start already serves the port
        for node in to_start:
            for port in (node.port, node.controller_port):
                if _port_stays_taken(port, config.broker.port_release_s):
                    raise LauncherError(
                        f"port {port} (Kafka node {node.node_id}) is taken by another process; stop it "
                        "or choose other ports (broker.port / broker.controller_port / broker.cluster_ports)"
                    )
        if to_start:
            _start(config, setup, to_start)
        _wait_ready(config, setup)
    return setup.bootstrap


@contextlib.contextmanager
def running(config: Config, brokers: int = 1) -> Iterator[str]:
    """The setup up for the block (yields its bootstrap address) and stopped after it, only when
    this call started it: what found it running (another run, `rollstream kafka up`) keeps it."""
    found = is_up(config, brokers)
    try:
        yield ensure_up(config, brokers)
    finally:
        if not found:
            down(config, brokers)


def _port_stays_taken(port: int, grace_s: float) -> bool:
    """True when `port` is still taken after `grace_s` (a node killed a moment ago may
    still hold it while the kernel tears the process down)."""
    deadline = time.monotonic() + grace_s
    while port_in_use(port):
        if time.monotonic() > deadline:
            return True
        time.sleep(0.25)
    return False


def _start(config: Config, setup: Layout, nodes: list[Node]) -> None:
    java = kafka_files.check_java()
    libs = kafka_files.ensure_jars(config.state_dir, config.broker)
    cid = kafka_files.cluster_id(setup)
    for node in nodes:
        kafka_files.render_properties(setup, node, config.broker)
        kafka_files.format_storage(java, libs, config.broker, setup, node, cid)
    for node in nodes:
        argv = kafka_files.java_argv(java, libs, config.broker, node, "kafka.Kafka")
        start_detached([*argv, str(node.properties)], node.log_file, node.pid_file, node.dir)


def _wait_ready(config: Config, setup: Layout) -> None:
    deadline = time.monotonic() + config.broker.startup_timeout_s
    expected = len(setup.nodes)
    while True:
        for node in setup.nodes:
            pid = read_pid(node.pid_file)
            if pid is None or not is_running(pid):
                node.pid_file.unlink(missing_ok=True)
                raise LauncherError(
                    f"Kafka node {node.node_id} exited during startup; last lines of "
                    f"{node.log_file}:\n{log_tail(node.log_file)}\n(see also {node.dir / 'server.log'})"
                )
        if broker_count(setup.bootstrap) >= expected:
            return
        if time.monotonic() > deadline:
            raise LauncherError(
                f"Kafka at {setup.bootstrap} did not answer within {config.broker.startup_timeout_s:.0f}s; "
                f"see {setup.root}/**/server.log"
            )
        time.sleep(0.5)


def is_up(config: Config, brokers: int = 1) -> bool:
    """True when a metadata request answers with every node of the setup."""
    setup = _setup(config, brokers)
    return broker_count(setup.bootstrap) >= len(setup.nodes)


def status(config: Config, brokers: int = 1) -> list[NodeStatus]:
    setup = _setup(config, brokers)
    return [
        NodeStatus(
            node.node_id,
            node.port,
            live_pid(node.pid_file, _marker(node)),
            broker_count(f"127.0.0.1:{node.port}", timeout_s=2.0) > 0,
            str(node.dir),
        )
        for node in setup.nodes
    ]


def down(config: Config, brokers: int = 1, *, wipe: bool = False) -> list[int]:
    """Stop the setup's nodes (SIGTERM, then SIGKILL after `broker.stop_timeout_s`);
    `wipe` also deletes their data (topics are lost). Returns the pids stopped."""
    setup = _setup(config, brokers)
    with file_lock(setup.root.parent / f"{setup.root.name}.lock"):
        pids = {node.node_id: live_pid(node.pid_file, _marker(node)) for node in setup.nodes}
        stopped = [pid for pid in pids.values() if pid is not None]
        # all at once: a cluster node shutting down alone waits for the others' quorum
        killed = stop_processes(stopped, config.broker.stop_timeout_s)
        if killed:
            logger.warning("Kafka pids %s ignored SIGTERM; killed them", killed)
        for node in setup.nodes:
            node.pid_file.unlink(missing_ok=True)
        if wipe:  # the data and cluster id go; logs stay for a post-mortem
            for node in setup.nodes:
                shutil.rmtree(node.data_dir, ignore_errors=True)
            setup.cluster_id_file.unlink(missing_ok=True)
    return stopped


def kill_node(config: Config, node_id: int, brokers: int) -> int:
    """SIGKILL one node (failure tests); returns its pid."""
    setup = _setup(config, brokers)
    node = next(n for n in setup.nodes if n.node_id == node_id)
    pid = live_pid(node.pid_file, _marker(node))
    if pid is None:
        raise LauncherError(f"Kafka node {node_id} is not running")
    kill_now(pid)
    return pid


def node_pid_file(config: Config, node_id: int, brokers: int) -> Path:
    """Where a node's pid file lives (tests simulate stale pid files with it)."""
    return next(n for n in _setup(config, brokers).nodes if n.node_id == node_id).pid_file


def cluster_overrides(config: Config, brokers: int) -> list[str]:
    """`--set` overrides that point a config at the setup with its replication settings."""
    setup = _setup(config, brokers)
    return [
        f'kafka.bootstrap="{setup.bootstrap}"',
        f"topics.replication_factor={setup.replication_factor}",
        f"topics.min_insync_replicas={setup.min_insync_replicas}",
    ]
