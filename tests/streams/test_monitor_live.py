"""The monitor on the real broker, scraped by a real Prometheus (Debian's `prometheus`).

Rollout events with injected sandbox faults go through the real stream worker (which
writes `trajectories`, `groups` and `sandbox.lifecycle`) and the SQL sink; `rollstream
monitor` runs as a process; Prometheus scrapes it every second. Prometheus' HTTP API
must then report as many trajectories as SQL holds, the infra-error series must match
the injected faults, and after a SIGKILL of the monitor and a restart (tables recovered
from faust's changelogs) the counters and the hopping window go on from where they
were, with no counter reset, and count a second batch exactly once.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from rollstream.config import Config
from rollstream.launcher.process import free_port, log_tail
from streams.app import StreamWorker
from streams.bus import EventProducer
from streams.eventgen import group_events, random_attempts
from streams.events import Event
from streams.sink import Sink
from streams.store import open_store

# `rollstream monitor` alone, so the test does not depend on every other command importing
MONITOR = [
    sys.executable,
    "-c",
    "import typer; from rollstream.commands.monitor import command; typer.run(command)",
]
PROMETHEUS = shutil.which("prometheus")


def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, ""
    except OSError:
        return 0, ""


def _poll(check: Callable[[], object], timeout_s: float, what: str | Callable[[], str]) -> object:
    deadline = time.monotonic() + timeout_s
    while not (result := check()):
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what() if callable(what) else what}")
        time.sleep(0.5)
    return result


@pytest.fixture
def monitor_port() -> int:
    return free_port()


@pytest.fixture
def prometheus(tmp_path: Path, monitor_port: int) -> Iterator[str]:
    """A real Prometheus scraping 127.0.0.1:<monitor_port> every second; yields its base URL."""
    if PROMETHEUS is None:
        pytest.fail("prometheus is not installed: run scripts/setup_system.sh")
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - {{job_name: rollstream, static_configs: [{{targets: ['127.0.0.1:{monitor_port}']}}]}}\n"
    )
    args = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    log = (tmp_path / "prometheus.log").open("wb")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _poll(lambda: _get(f"{url}/-/ready")[0] == 200, 60, "prometheus to be ready")
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def _query(prometheus: str, promql: str) -> list[dict]:
    status, body = _get(f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert status == 200, f"query {promql!r} failed with {status}"
    return json.loads(body)["data"]["result"]


def _by(prometheus: str, promql: str, label: str) -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in _query(prometheus, promql)}


def _batch(seed: int, groups: int) -> list[Event]:
    rng = random.Random(seed)
    events: list[Event] = []
    for g in range(groups):
        events += group_events(f"run-{seed}", f"run-{seed}/g{g}", random_attempts(rng, 4, infra_rate=0.3))
    return events


async def _through_pipeline(config: Config, events: list[Event], groups_total: int) -> None:
    """Produce `events`, run the stream worker until `groups_total` groups exist, sink to SQL."""
    async with EventProducer(config.kafka, config.topics) as producer:
        for event in events:
            await producer.send("rollout.events", event)
        await producer.flush()
    stop = asyncio.Event()
    worker = StreamWorker(config.kafka, config.topics, config.policy, config.streams)
    task = asyncio.create_task(worker.run(stop))
    deadline = time.monotonic() + 60
    while worker.stats.groups < groups_total and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.2)
    stop.set()
    await task
    assert worker.stats.groups == groups_total


def _sql_outcomes(config: Config) -> Counter[str]:
    engine = open_store(config.db_url)
    try:
        asyncio.run(Sink(config.kafka, config.topics, config.db, engine).run(until_idle_s=1))
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT outcome, count(*) FROM trajectories GROUP BY outcome")).all()
    finally:
        engine.dispose()
    return Counter({str(outcome): int(n) for outcome, n in rows})


def _start_monitor(config: Config, port: int, log: Path) -> subprocess.Popen[bytes]:
    settings = [
        f'kafka.bootstrap="{config.kafka.bootstrap}"',
        f'topics.prefix="{config.topics.prefix}"',
        f'run.state_dir="{config.state_dir}"',
        "monitor.session_timeout_s=6",
    ]
    args = [*MONITOR, "--port", str(port), *(arg for s in settings for arg in ("-s", s))]
    return subprocess.Popen(args, stdout=log.open("ab"), stderr=subprocess.STDOUT)


def _injected(outcomes: Counter[str]) -> dict[str, float]:
    return {k.partition(":")[2]: float(v) for k, v in outcomes.items() if k.startswith("infra_error:")}


def _agrees(prometheus: str, outcomes: Counter[str], monitor: subprocess.Popen[bytes], log: Path) -> bool:
    """Totals, the hopping window and the sandbox failures (another topic) all caught up."""
    assert monitor.poll() is None, f"the monitor exited with {monitor.returncode}:\n{log_tail(log)}"
    total = _by(prometheus, "sum(rollstream_trajectories_total)", "")
    window = _by(prometheus, 'sum(rollstream_window_trajectories{window="hopping_600s"})', "")
    failures = _by(prometheus, "sum by (kind) (rollstream_sandbox_failures_total)", "kind")
    _last_seen.update(total=total, window=window, failures=failures)
    want = float(sum(outcomes.values()))
    return total.get("") == want and window.get("") == want and failures == _injected(outcomes)


_last_seen: dict[str, dict[str, float]] = {}  # what prometheus last said, for a timeout's message


def _disagreement(outcomes: Counter[str], log: Path) -> str:
    return f"prometheus to report {dict(outcomes)}; it last said {_last_seen}; monitor log:\n{log_tail(log)}"


async def _committed(config: Config, short: str) -> int:
    """Sum of the monitor's committed offsets on `short`: records a restart does not read again."""
    admin = AIOKafkaAdminClient(bootstrap_servers=config.kafka.bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(config.topics.prefix + config.monitor.app_id)
    finally:
        await admin.close()
    name = config.topics.prefix + short
    return sum(meta.offset for tp, meta in offsets.items() if tp.topic == name and meta.offset > 0)


async def _delete_prefixed(config: Config) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=config.kafka.bootstrap)
    await admin.start()
    try:
        names = [n for n in await admin.list_topics() if n.startswith(config.topics.prefix)]
        if names:
            await admin.delete_topics(names)
    finally:
        await admin.close()


def test_prometheus_sees_what_sql_holds_across_a_monitor_sigkill(
    config_factory: Callable[..., Config], prometheus: str, monitor_port: int, tmp_path: Path
) -> None:
    config = config_factory("streams.commit_interval_s=0.2")
    log = tmp_path / "monitor.log"
    monitor = _start_monitor(config, monitor_port, log)
    try:
        asyncio.run(_through_pipeline(config, _batch(1, 8), 8))
        outcomes = _sql_outcomes(config)
        injected = _injected(outcomes)
        assert injected, "the batch must contain injected infra errors"
        _poll(lambda: _agrees(prometheus, outcomes, monitor, log), 90, lambda: _disagreement(outcomes, log))
        by_outcome = _by(prometheus, "rollstream_trajectories_total", "outcome")
        assert by_outcome == {k: float(v) for k, v in outcomes.items()}
        assert _by(prometheus, "rollstream_infra_errors_total", "kind") == injected
        backends = _by(prometheus, "sum by (backend) (rollstream_sandbox_failures_total)", "backend")
        assert backends == {"simulated": sum(injected.values())}  # the infra-error rate by backend
        status, body = _get(f"http://127.0.0.1:{monitor_port}/metrics")
        names = {family.name for family in text_string_to_metric_families(body)}
        assert status == 200 and {"rollstream_trajectories", "rollstream_sandbox_start_seconds"} <= names

        # once its offsets are committed, a restarted monitor does not read these records again:
        # what it reports for them afterwards can only come from its tables' changelogs
        written = sum(outcomes.values())
        _poll(lambda: asyncio.run(_committed(config, "trajectories")) == written, 30, "monitor commits")
        monitor.send_signal(signal.SIGKILL)
        monitor.wait(timeout=30)
        monitor = _start_monitor(config, monitor_port, log)
        asyncio.run(_through_pipeline(config, _batch(2, 6), 6))
        outcomes = _sql_outcomes(config)
        _poll(lambda: _agrees(prometheus, outcomes, monitor, log), 120, lambda: _disagreement(outcomes, log))
        resets = _by(prometheus, "resets(rollstream_trajectories_total[10m])", "outcome")
        assert resets and set(resets.values()) == {0.0}
        monitor.send_signal(signal.SIGTERM)
        assert monitor.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        if monitor.poll() is None:
            monitor.kill()
            monitor.wait()
        asyncio.run(_delete_prefixed(config))
