"""A training run's report shows learning by weight version.

Episodes run by the real `Episode` (simulated sandboxes, a scripted policy at weight
versions 1, 2 and 3 whose pass rate rises with the version, one sandbox that fails to
start) are written to the store (SQLite and PostgreSQL) and reported: every trajectory
is attributed to the version of its first token, the one that never generated to none,
and pass@1 by version has a point per version. The same run as v1 workers wrote it (a
made-up version 0 until the first generation) reads the same, re-sunk from its records or
migrated in a store written before the fix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from agents.chat import ChatFormat
from agents.episode import Episode, EpisodeServices, EpisodeSpec
from agents.scripted import ScriptedPolicy
from agents.settings import AgentSettings
from rollstream.report.build import ReportError, load_rows
from rollstream.report.figures import figures
from rollstream.report.settings import ReportSettings
from rollstream.report.tables import summary
from sandboxes.base import Sandbox
from sandboxes.simulated import SimulatedLatency, SimulatedSandboxFactory
from sandboxes.tasks import Verdict
from sandboxes.tasks.harbor import Task, TaskMetadata
from streams.events import Event, encode_event
from streams.payloads import Limits
from streams.store import StoredEvent, event_from_row, open_store, write_batch
from streams.store.migrate import create_store_engine, upgrade
from streams.store.wire import decode_record, to_wire
from tests.agents.conftest import Collected
from tests.agents.test_episode import SUBMIT, DirectSandboxes, bash
from tests.store.batches import ends, positioned, write_in_batches
from trainer.tokenizer import train_tokenizer

RUN = "versions-run"
VERSIONS = (1, 2, 3)
ATTEMPTS = 4
TASK = Task("task-1", Path("/nonexistent"), "Fix the bug.", None, TaskMetadata(("test_fix",)))


@pytest.fixture(scope="module")
def run_events() -> list[Event]:
    chat = ChatFormat.for_tokenizer(train_tokenizer(1024))
    return asyncio.run(_run(chat))


async def _run(chat: ChatFormat) -> list[Event]:
    events: list[Event] = []
    for version in VERSIONS:
        for attempt in range(ATTEMPTS):
            events += await _episode(chat, version, attempt, resolved=attempt < version)
    events += await _episode(chat, 2, ATTEMPTS, resolved=True, start_fails=True)
    return events


async def _episode(
    chat: ChatFormat, version: int, attempt: int, *, resolved: bool, start_fails: bool = False
) -> list[Event]:
    async def verifier(box: Sandbox, task: Task) -> Verdict:
        reward = 1.0 if resolved else 0.0
        return Verdict(reward, {"test_fix": resolved}, {}, 0.01)

    latency = SimulatedLatency(time_scale=0.001, start_failure_rate=1.0 if start_fails else 0.0)
    services = EpisodeServices(
        policy=ScriptedPolicy(chat, [bash("ls"), bash(SUBMIT)], weight_version=version),
        sandboxes=DirectSandboxes(SimulatedSandboxFactory(latency)),
        verifier=verifier,
        chat=chat,
        agent=AgentSettings(),
        backend="simulated",
        source="rollout-0",
        command_timeout_s=10.0,
    )
    group = f"g-v{version}"
    spec = EpisodeSpec(RUN, group, f"{group}-a{attempt}", TASK, attempt, 0, ATTEMPTS, Limits())
    sink = Collected()
    await Episode(spec, services, sink).run()
    return sink.events


def v1_versions(events: list[Event]) -> list[int]:
    """What v1 workers wrote as `policy_version`: 0 until the trajectory's first generation, then
    the highest version its generations reported."""
    seen: dict[str | None, int] = {}
    out = []
    for event in events:
        if event.type == "turn.generated":
            seen[event.trajectory_id] = max(seen.get(event.trajectory_id, 0), event.data.weight_version)  # type: ignore[attr-defined]
        out.append(seen.get(event.trajectory_id, 0))
    return out


def v1_records(events: list[Event]) -> list[bytes]:
    records = []
    for event, version in zip(events, v1_versions(events), strict=True):
        raw = json.loads(encode_event(event)) | {"schema_version": 1, "policy_version": version}
        records.append(json.dumps(raw).encode())
    return records


def check_report(db_url: str) -> None:
    with open_store(db_url).connect() as conn:
        attributed = dict(
            conn.execute(text("SELECT trajectory_id, start_policy_version FROM trajectories")).all()
        )
    expected = {f"g-v{v}-a{a}": v for v in VERSIONS for a in range(ATTEMPTS)} | {f"g-v2-a{ATTEMPTS}": None}
    assert attributed == expected
    rows = load_rows(db_url, RUN)
    pass1 = next(f for f in figures(rows, ReportSettings()) if f.key == "pass1_by_version")
    curve = dict(zip(pass1.series[0].x, pass1.series[0].y, strict=True))
    assert curve == {float(v): v / ATTEMPTS for v in VERSIONS}  # learning, by version
    assert pass1.notes[0] == f"{len(VERSIONS) * ATTEMPTS} scored attempts; 1 infrastructure errors not scored"
    assert summary(rows, ReportSettings())["weight versions"] == "1-3"


def test_the_report_attributes_each_trajectory_to_its_first_tokens_version(
    db_url: str, run_events: list[Event]
) -> None:
    write_in_batches(db_url, positioned(run_events))
    check_report(db_url)


def test_a_run_written_by_v1_workers_reports_the_same(db_url: str, run_events: list[Event]) -> None:
    """Re-sunk from the topics: the sink reads v1 records through the upcaster."""
    v1 = [decode_record(record)[0] for record in v1_records(run_events)]
    assert [e.policy_version for e in v1] == [e.policy_version for e in run_events]
    write_in_batches(
        db_url,
        [
            StoredEvent(e, s.topic, s.partition, s.offset)
            for e, s in zip(v1, positioned(run_events), strict=True)
        ],
    )
    check_report(db_url)


def test_a_store_written_before_the_fix_is_migrated(db_url: str, run_events: list[Event]) -> None:
    """A database of revision 0003 holds v1 rows and trajectories projected at the made-up 0;
    revision 0004 attributes them to their first token, and the rows read back as v2."""
    engine = create_store_engine(db_url)
    upgrade(engine, "0003")
    v1 = [
        to_wire(e.model_copy(update={"schema_version": 1, "policy_version": version}))
        for e, version in zip(run_events, v1_versions(run_events), strict=True)
    ]
    stored = [
        StoredEvent(e, s.topic, s.partition, s.offset)
        for e, s in zip(v1, positioned(run_events), strict=True)
    ]
    with engine.begin() as conn:  # the sink at revision 0003: v1 rows, trajectories at the made-up 0
        write_batch(conn, stored, ends(stored), "sink")
        conn.execute(text("UPDATE trajectories SET start_policy_version = 0"))
        conn.execute(text("UPDATE trajectories SET end_policy_version = 0 WHERE turns = 0"))
    with pytest.raises(ReportError, match="schema revision 0003, not 0004: run `rollstream db upgrade"):
        load_rows(db_url, RUN)  # not a report of the made-up zeros
    upgrade(engine)
    check_report(db_url)
    with engine.connect() as conn:
        stored = {row.id: event_from_row(row) for row in conn.execute(text("SELECT * FROM events"))}
    assert [stored[str(e.id)] for e in run_events] == run_events
    engine.dispose()
