"""The tail simulation drives the real processor: sync waits for stragglers, async aborts them."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress

from bench.tail import run_async, run_sync
from bench.workload import WorkloadProfile
from streams.settings import PolicySettings

POLICY = PolicySettings(group_size=8, max_staleness=-1)


def test_async_with_deadline_beats_sync_steps() -> None:
    profile = WorkloadProfile()
    with Progress(console=Console(quiet=True)) as progress:
        sync_steps, sync_tails = run_sync(profile, POLICY, 4, 2, progress)
        async_steps, async_tails, sim = run_async(profile, POLICY, 4, 3, 150.0, progress)
    assert len(sync_steps) == 2 and len(async_steps) == 2
    assert sim.cut > 0  # the deadline's aborts reached the simulated rollout side
    assert all(s > 300 for s in sync_steps)  # a sync step waits for the 80-turn episodes
    assert max(async_steps) < min(sync_steps) / 2
    assert all(0 <= share < 1 for share in sync_tails + async_tails)
