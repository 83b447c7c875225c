"""The reference workload profile reproduces the published figures."""

from __future__ import annotations

import statistics

import pytest

from bench.workload import (
    WorkloadProfile,
    littles_law_bound_per_h,
    mean_episode_s,
    mean_turns,
    plan_episode,
    sample_sandbox_start_s,
    submitted_turns_pmf,
)

PROFILE = WorkloadProfile()
PLANS = [plan_episode(f"t{i}", PROFILE) for i in range(6000)]


def test_plans_are_deterministic_in_their_key() -> None:
    assert plan_episode("abc", PROFILE) == plan_episode("abc", PROFILE)
    assert plan_episode("abc", PROFILE) != plan_episode("abd", PROFILE)


def test_sandbox_start_median_and_p99() -> None:
    import random

    rng = random.Random(1)
    starts = sorted(sample_sandbox_start_s(rng, PROFILE) for _ in range(20000))
    assert statistics.median(starts) == pytest.approx(1.9, rel=0.03)
    assert starts[int(0.99 * len(starts))] == pytest.approx(3.7, rel=0.05)


def test_turn_cap_share_and_resolved_median() -> None:
    capped = [p for p in PLANS if not p.submits]
    assert len(capped) / len(PLANS) == pytest.approx(0.84, abs=0.015)
    assert all(p.turns == 80 and not p.resolved for p in capped)
    resolved = [p.turns for p in PLANS if p.resolved]
    assert statistics.median(resolved) == pytest.approx(8, abs=1)


def test_llm_call_mean() -> None:
    calls = [s for p in PLANS[:500] for s in p.llm_s]
    assert statistics.fmean(calls) == pytest.approx(4.4, rel=0.03)


def test_closed_form_mean_matches_sampled_plans() -> None:
    assert sum(submitted_turns_pmf(PROFILE).values()) == pytest.approx(1.0)
    assert statistics.fmean(p.turns for p in PLANS) == pytest.approx(mean_turns(PROFILE), rel=0.02)
    assert statistics.fmean(p.total_s for p in PLANS) == pytest.approx(mean_episode_s(PROFILE), rel=0.02)
    assert littles_law_bound_per_h(384, PROFILE) == pytest.approx(384 * 3600 / mean_episode_s(PROFILE))


def test_bad_profile_is_refused() -> None:
    with pytest.raises(ValueError, match="capped_fraction"):
        WorkloadProfile(capped_fraction=1.5)
