"""`streams.heartbeat`: beats only when a supervisor asks for them, from the running loop, and
stop when the loop is blocked or the check fails."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from streams.heartbeat import (
    HEARTBEAT_FILE_ENV,
    HEARTBEAT_INTERVAL_ENV,
    beat_age_s,
    start_heartbeat,
    stop_heartbeat,
)


def test_unsupervised_processes_write_no_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HEARTBEAT_FILE_ENV, raising=False)

    async def scenario() -> None:
        assert start_heartbeat() is None

    asyncio.run(scenario())


def test_beats_follow_the_loop_and_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    beat = tmp_path / "x.heartbeat"
    monkeypatch.setenv(HEARTBEAT_FILE_ENV, str(beat))
    monkeypatch.setenv(HEARTBEAT_INTERVAL_ENV, "0.1")
    healthy = {"ok": True}
    since = time.time()

    async def scenario() -> tuple[float | None, float | None, float | None]:
        task = start_heartbeat(check=lambda: healthy["ok"])
        await asyncio.sleep(0.3)
        fresh = beat_age_s(beat, since)
        time.sleep(0.6)  # the loop is blocked: no beat
        blocked = beat_age_s(beat, since)
        healthy["ok"] = False
        await asyncio.sleep(0.5)
        failing = beat_age_s(beat, since)
        await stop_heartbeat(task)
        return fresh, blocked, failing

    fresh, blocked, failing = asyncio.run(scenario())
    assert fresh is not None and fresh < 0.25
    assert blocked is not None and blocked >= 0.5
    assert failing is not None and failing >= 0.4
    assert beat.read_text().split()[0].isdigit()  # "<pid> <time>"
    assert beat_age_s(beat, time.time() + 10) is None  # a beat from before `since` does not count
