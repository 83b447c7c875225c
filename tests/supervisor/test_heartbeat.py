"""`streams.heartbeat`: beats only when a supervisor asks for them, from the running loop, and
stop when the loop is blocked or the check fails."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from streams.heartbeat import (
    HEARTBEAT_FILE_ENV,
    HEARTBEAT_INTERVAL_ENV,
    beat_age_s,
    heartbeat_target,
    mark_rank_start,
    rank_file,
    start_file,
    start_heartbeat,
    stop_heartbeat,
)


def test_unsupervised_processes_write_no_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HEARTBEAT_FILE_ENV, raising=False)

    async def scenario() -> None:
        assert start_heartbeat() is None

    asyncio.run(scenario())


def test_beats_follow_the_loop_and_the_check(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Which beats happen is asserted, not how late they are: a loaded CI machine may
    deschedule the test for longer than any interval, but a blocked loop or a failing
    check can never beat, and a running, healthy loop always beats again."""
    beat = tmp_path / "x.heartbeat"
    monkeypatch.setenv(HEARTBEAT_FILE_ENV, str(beat))
    monkeypatch.setenv(HEARTBEAT_INTERVAL_ENV, "0.05")
    healthy = {"ok": True}
    since = time.time()

    async def next_beat(after: str | None, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = beat.read_text() if beat.exists() else None
            if text is not None and text != after:
                return text
            await asyncio.sleep(0.01)
        raise AssertionError(f"no new beat within {timeout_s} s")

    async def scenario() -> None:
        task = start_heartbeat(check=lambda: healthy["ok"])
        first = await next_beat(None)
        second = await next_beat(first)  # a running loop keeps beating
        assert float(second.split()[1]) > float(first.split()[1])
        time.sleep(0.3)  # the loop is blocked: nothing can beat
        assert beat.read_text() == second
        healthy["ok"] = False
        await asyncio.sleep(0.3)  # the loop runs, but the check fails: no beat
        assert beat.read_text() == second
        healthy["ok"] = True
        await next_beat(second)  # beats resume with the check
        await stop_heartbeat(task)

    asyncio.run(scenario())
    assert beat.read_text().split()[0] == str(os.getpid())  # "<pid> <time>"
    assert beat_age_s(beat, since) is not None
    assert beat_age_s(beat, time.time() + 10) is None  # a beat from before `since` does not count


def test_each_rank_of_several_beats_its_own_file_and_marks_the_group_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    beat = tmp_path / "trainer.heartbeat"
    monkeypatch.setenv(HEARTBEAT_FILE_ENV, str(beat))
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert heartbeat_target() == (beat, 2.0)  # one process: the file itself
    mark_rank_start()
    assert not start_file(beat).exists()
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert heartbeat_target() == (rank_file(beat, 1), 2.0) == (tmp_path / "trainer.heartbeat.rank1", 2.0)
    before = time.time()
    mark_rank_start()
    assert start_file(beat).exists() and beat_age_s(start_file(beat), before - 1) is not None
