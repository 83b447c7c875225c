"""`rollstream sink` against the real broker and both databases: complete, exactly once, killable."""

from __future__ import annotations

import asyncio
import base64
import json
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from rollstream.config import Config
from streams.bus import read_topic
from streams.eventgen import generate_events
from streams.sink import Sink, SinkError
from streams.store import open_readonly, open_store
from streams.store.writer import store_offsets
from streams.topics import topic_name
from tests.store.expect import assert_events_stored, assert_projections, scalar
from tests.store.sinkrun import (
    checked_count,
    offsets_match_rows,
    produce,
    run_sink_until_idle,
    start_sink,
    stored_offsets,
    topic_ends,
    wait_until,
)

EVENTS = 10_000
BAD_RECORDS = [
    ("rollout.events", b"{not json"),
    (
        "trainer.steps",
        json.dumps({"type": "trainer.step", "schema_version": 1, "data": {"step": -1}}).encode(),
    ),
    ("rollout.events", b'{"type": "no.such.type", "schema_version": 1, "data": {}}'),
]


def test_sink_stores_every_event_and_dead_letters_bad_records(
    config_factory: Callable[..., Config], db_url: str, tmp_path: Path
) -> None:
    config = config_factory()
    events = generate_events(EVENTS, seed=21)
    produce(config, events, bad=BAD_RECORDS)
    run_sink_until_idle(config, db_url, tmp_path / "sink.log")
    engine = open_readonly(db_url)
    assert_events_stored(engine, events)
    assert_projections(engine, events)
    # Bad records are skipped but their offsets are covered: the stored offsets are the topic ends.
    assert stored_offsets(engine) == {where: end for where, end in topic_ends(config).items() if end}
    engine.dispose()
    consumed = asyncio.run(read_topic(config.kafka, config.topics, "deadletter", idle_s=120))
    letters = [item.event for item in consumed]
    assert sorted(letter.data.value_b64 for letter in letters) == sorted(  # type: ignore[attr-defined]
        base64.b64encode(value).decode() for _, value in BAD_RECORDS
    )


def test_sink_killed_mid_run_resumes_exactly_once(
    config_factory: Callable[..., Config], db_url: str, tmp_path: Path
) -> None:
    config = config_factory("db.sink_batch_size=100")  # many transactions, so the kill lands mid-stream
    events = generate_events(EVENTS, seed=33)
    produce(config, events)
    log = tmp_path / "sink.log"
    assert interrupt(config, db_url, log, EVENTS // 20, signal.SIGKILL) == -signal.SIGKILL
    engine = open_readonly(db_url)
    killed_at = scalar(engine, "SELECT COUNT(*) FROM events")
    assert killed_at < EVENTS, "the sink finished before it was killed; the test proves nothing"
    offsets_match_rows(engine)  # what the killed process committed is self-consistent
    engine.dispose()

    # SIGTERM: the restarted sink finishes the batch in hand and exits cleanly.
    assert interrupt(config, db_url, log, killed_at + 1, signal.SIGTERM) == 0, log.read_text()[-2000:]
    run_sink_until_idle(config, db_url, log)
    engine = open_readonly(db_url)
    assert scalar(engine, "SELECT COUNT(*) FROM events") == EVENTS
    assert scalar(engine, "SELECT COUNT(DISTINCT id) FROM events") == EVENTS
    assert stored_offsets(engine) == {where: end for where, end in topic_ends(config).items() if end}
    offsets_match_rows(engine)
    assert_events_stored(engine, events)
    assert_projections(engine, events)
    engine.dispose()


def interrupt(config: Config, url: str, log: Path, at_least: int, signum: signal.Signals) -> int:
    """Start the sink, send `signum` once it stored `at_least` events; its exit code."""
    sink = start_sink(config, url, log)
    try:
        # Every poll also checks that the offsets in that snapshot match its rows exactly.
        wait_until(lambda: checked_count(url) >= at_least, 300, f"{at_least} events in SQL ({log})")
        sink.send_signal(signum)
        return sink.wait(timeout=120)
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()


def test_sink_refuses_offsets_past_the_topic_end_and_missing_topics(
    config_factory: Callable[..., Config], sqlite_url: str
) -> None:
    config = config_factory()
    engine = open_store(sqlite_url)
    with engine.begin() as conn:  # as if the topics had been recreated after this database was written
        store_offsets(conn, config.db.sink_group, {(topic_name(config.topics, "rollout.events"), 0): 500})
    with pytest.raises(SinkError, match=r"past the end of .*rollout\.events\[0\]"):
        asyncio.run(Sink(config.kafka, config.topics, config.db, engine).run(until_idle_s=1))
    missing = config_factory(create_topics=False)
    with pytest.raises(SinkError, match="rollstream topics create"):
        asyncio.run(Sink(missing.kafka, missing.topics, missing.db, engine).run(until_idle_s=1))
    engine.dispose()
