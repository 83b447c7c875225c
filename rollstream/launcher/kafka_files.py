"""What a Kafka node needs on disk: the broker jars (fetched once with Maven from
`infra/kafka/pom.xml`), a rendered `server.properties` and formatted KRaft storage.

Layout under `<state_dir>/kafka/`: `libs/` (jars, shared by every node),
`single/` (the one-node broker) and `cluster/node-<id>/` (the three-node cluster);
each node directory holds `server.properties`, `data/`, `stdout.log`, `server.log`
and `kafka.pid`; each layout keeps its `cluster.id` beside the node directories.
"""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path
from string import Template

from rollstream.config import BrokerSettings
from rollstream.launcher.process import LauncherError

INFRA_DIR = Path(__file__).resolve().parents[2] / "infra" / "kafka"
MIN_JAVA = 17
NETWORK_FAILURE = re.compile(
    r"Could not transfer|UnknownHost|Network is unreachable|Connection (refused|timed out)"
    r"|offline mode|Temporary failure in name resolution|No route to host",
    re.IGNORECASE,
)
MISSING_ARTIFACT = re.compile(r"Could not find artifact (\S+)|(\S+) was not found in")


@dataclass(frozen=True)
class Node:
    node_id: int
    port: int
    controller_port: int
    dir: Path

    @property
    def properties(self) -> Path:
        return self.dir / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.dir / "data"

    @property
    def pid_file(self) -> Path:
        return self.dir / "kafka.pid"

    @property
    def log_file(self) -> Path:
        return self.dir / "stdout.log"


@dataclass(frozen=True)
class Layout:
    """One broker setup: the single node or the cluster."""

    root: Path
    nodes: tuple[Node, ...]

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    @property
    def cluster_id_file(self) -> Path:
        return self.root / "cluster.id"

    @property
    def replication_factor(self) -> int:
        return min(3, len(self.nodes))

    @property
    def min_insync_replicas(self) -> int:
        return 2 if len(self.nodes) >= 3 else 1


def layout(state_dir: Path, broker: BrokerSettings, brokers: int) -> Layout:
    kafka_dir = state_dir.resolve() / "kafka"
    if brokers == 1:
        node = Node(1, broker.port, broker.controller_port, kafka_dir / "single")
        return Layout(kafka_dir / "single", (node,))
    if brokers != len(broker.cluster_ports):
        raise LauncherError(
            f"--brokers {brokers} is not supported: use 1 or {len(broker.cluster_ports)} "
            "(broker.cluster_ports lists the cluster's ports)"
        )
    root = kafka_dir / "cluster"
    ports = zip(broker.cluster_ports, broker.cluster_controller_ports, strict=True)
    nodes = tuple(Node(i + 1, port, ctrl, root / f"node-{i + 1}") for i, (port, ctrl) in enumerate(ports))
    return Layout(root, nodes)


def libs_dir(state_dir: Path) -> Path:
    return state_dir.resolve() / "kafka" / "libs"


def check_java() -> str:
    """Path of a Java >= 17, or a clear error."""
    java = shutil.which("java")
    if java is None:
        raise LauncherError(
            f"Java is not installed (Kafka needs Java {MIN_JAVA}+): run scripts/setup_system.sh "
            "or apt-get install openjdk-17-jre-headless"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):
        major = int(match.group(2))
    if major < MIN_JAVA:
        raise LauncherError(f"Kafka needs Java {MIN_JAVA}+, found: {out.strip().splitlines()[:1]}")
    return java


def ensure_jars(state_dir: Path, broker: BrokerSettings) -> Path:
    """The broker jars for `broker.version`, fetched with Maven on first use."""
    libs = libs_dir(state_dir)
    marker = libs / ".version"
    if marker.exists() and marker.read_text().strip() == broker.version:
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise LauncherError(
            "Maven (mvn) is not installed; it fetches the Kafka jars from Maven Central: "
            "run scripts/setup_system.sh or apt-get install maven"
        )
    staging = libs.with_name("libs.partial")
    shutil.rmtree(staging, ignore_errors=True)
    argv = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(INFRA_DIR / "pom.xml"),
        "dependency:copy-dependencies",
        f"-Dkafka.version={broker.version}",
        f"-DoutputDirectory={staging}",
    ]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=broker.jar_fetch_timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise LauncherError(
            f"Maven did not finish fetching Kafka {broker.version} within {broker.jar_fetch_timeout_s:.0f}s "
            "(is Maven Central reachable?)"
        ) from None
    if done.returncode != 0 or not any(staging.glob("kafka_2.13-*.jar")):
        output = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr).strip()
        missing = MISSING_ARTIFACT.search(output)
        if missing:
            artifact = missing.group(1) or missing.group(2)
            hint = f"Maven Central has no {artifact} (is broker.version={broker.version!r} right?)"
        elif NETWORK_FAILURE.search(output):
            hint = "Maven could not reach Maven Central (offline? a proxy needed in ~/.m2/settings.xml?)"
        else:
            hint = "Maven failed"
        tail = "\n".join([line for line in output.splitlines() if line.startswith("[ERROR]")][:3])
        raise LauncherError(f"{hint} while fetching org.apache.kafka:kafka_2.13:{broker.version}.\n{tail}")
    (staging / ".version").write_text(broker.version + "\n")
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    return libs


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding, never starting
    with '-' (Kafka's own ids avoid it too: command lines would read it as an option)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def formatted_cluster_id(node: Node) -> str | None:
    meta = node.data_dir / "meta.properties"
    if not meta.exists():
        return None
    match = re.search(r"^cluster\.id=(\S+)", meta.read_text(), re.MULTILINE)
    return match.group(1) if match else None


def cluster_id(setup: Layout) -> str:
    """The layout's cluster id; a data dir formatted for a different cluster is an error."""
    formatted = {node.node_id: formatted_cluster_id(node) for node in setup.nodes}
    stored = setup.cluster_id_file.read_text().strip() if setup.cluster_id_file.exists() else None
    expected = stored or next((cid for cid in formatted.values() if cid), None) or new_cluster_id()
    for node in setup.nodes:
        found = formatted[node.node_id]
        if found and found != expected:
            raise LauncherError(
                f"data dir {node.data_dir} belongs to Kafka cluster {found}, but this launcher's "
                f"cluster is {expected} ({setup.cluster_id_file}). Remove that data dir to start "
                "afresh (its topics are lost), or restore the matching cluster.id."
            )
    setup.root.mkdir(parents=True, exist_ok=True)
    setup.cluster_id_file.write_text(expected + "\n")
    return expected


def render_properties(setup: Layout, node: Node, broker: BrokerSettings) -> None:
    if len(setup.nodes) == 1:
        quorum = f"controller.quorum.bootstrap.servers=127.0.0.1:{node.controller_port}"
    else:
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in setup.nodes)
        quorum = f"controller.quorum.voters={voters}"
    template = Template((INFRA_DIR / "server.properties.template").read_text())
    text = template.substitute(
        node_id=node.node_id,
        port=node.port,
        controller_port=node.controller_port,
        quorum=quorum,
        data_dir=node.data_dir,
        replication_factor=setup.replication_factor,
        min_insync_replicas=setup.min_insync_replicas,
        message_max_bytes=broker.message_max_bytes,
        socket_request_max_bytes=max(104_857_600, 2 * broker.message_max_bytes),
        offsets_partitions=broker.offsets_partitions,
    )
    node.dir.mkdir(parents=True, exist_ok=True)
    node.properties.write_text(text)


def java_argv(java: str, libs: Path, broker: BrokerSettings, node: Node, main: str) -> list[str]:
    return [
        java,
        f"-Xmx{broker.heap_mb}m",
        f"-Xms{min(broker.heap_mb, 128)}m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={INFRA_DIR / 'log4j2.xml'}",
        f"-Dkafka.logs.dir={node.dir}",
        "-cp",
        f"{libs}/*",
        main,
    ]


def format_storage(
    java: str, libs: Path, broker: BrokerSettings, setup: Layout, node: Node, cid: str
) -> None:
    """`kafka.tools.StorageTool format` (standalone controller for the single node)."""
    if formatted_cluster_id(node):
        return
    argv = [*java_argv(java, libs, broker, node, "kafka.tools.StorageTool"), "format", f"--cluster-id={cid}"]
    argv += ["-c", str(node.properties)]
    if len(setup.nodes) == 1:
        argv.append("--standalone")
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
    if done.returncode != 0:
        raise LauncherError(
            f"formatting {node.data_dir} failed:\n{(done.stdout + done.stderr).strip()[-2000:]}"
        )
