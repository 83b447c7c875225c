"""The reference run's rollout workload as pure functions (no clock, no I/O).

Figures from the published run (DESIGN.md): sandbox start median 1.9 s and p99
3.7 s (lognormal), one LLM call ~4.4 s under load, 84% of episodes reach the
80-turn cap, and the median resolved episode needs 8 turns. The figures the
run did not publish (tool command and verifier durations, the share of
submitted episodes that resolve) are named assumptions in `WorkloadProfile`.

An `EpisodePlan` is everything the simulated engine, sandbox and verifier need
to replay one episode: how many turns, whether the agent submits and whether
the fix is right, and the duration of every step. Plans are deterministic in
a key (the trajectory id), so a re-run of an episode replays the same plan.
Durations here are unscaled seconds; `scaled(seconds, profile)` is the wall
time a time-scaled simulation sleeps.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

Z99 = 2.3263478740408408  # standard normal quantile at 0.99


@dataclass(frozen=True)
class WorkloadProfile:
    sandbox_start_median_s: float = 1.9
    sandbox_start_p99_s: float = 3.7
    llm_call_mean_s: float = 4.4
    llm_call_sigma: float = 0.3  # lognormal shape of one call under load
    turn_cap: int = 80
    capped_fraction: float = 0.84
    submitted_median_turns: float = 8.0  # median turns of episodes that submit (resolved or not)
    submitted_turns_sigma: float = 0.6
    resolved_fraction_of_submitted: float = 0.75  # assumption: not published
    tool_median_s: float = 0.4  # assumption: not published
    tool_sigma: float = 0.8
    verifier_median_s: float = 6.0  # assumption: not published
    verifier_sigma: float = 0.4
    time_scale: float = 1.0  # wall seconds per workload second (0.01 = 100x faster)

    def __post_init__(self) -> None:
        if not 0.0 <= self.capped_fraction <= 1.0:
            raise ValueError(f"capped_fraction must be in [0, 1], got {self.capped_fraction}")
        if self.turn_cap < 2:
            raise ValueError(f"turn_cap must be at least 2, got {self.turn_cap}")
        if self.sandbox_start_p99_s <= self.sandbox_start_median_s:
            raise ValueError("sandbox_start_p99_s must exceed sandbox_start_median_s")
        if self.time_scale <= 0:
            raise ValueError(f"time_scale must be positive, got {self.time_scale}")


@dataclass(frozen=True)
class EpisodePlan:
    """One simulated episode. `llm_s` has one entry per turn, `tool_s` one per command run."""

    turns: int
    submits: bool  # False: the agent never submits and reaches the turn cap
    resolved: bool
    sandbox_start_s: float
    llm_s: tuple[float, ...]
    tool_s: tuple[float, ...]
    verifier_s: float

    @property
    def total_s(self) -> float:
        return self.sandbox_start_s + sum(self.llm_s) + sum(self.tool_s) + self.verifier_s


def lognormal_params(median: float, p99: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this median and 99th percentile."""
    mu = math.log(median)
    return mu, (math.log(p99) - mu) / Z99


def lognormal_mean(mu: float, sigma: float) -> float:
    return math.exp(mu + sigma * sigma / 2)


def llm_mu(profile: WorkloadProfile) -> float:
    """mu such that the call latency's mean is `llm_call_mean_s`."""
    return math.log(profile.llm_call_mean_s) - profile.llm_call_sigma**2 / 2


def sample_sandbox_start_s(rng: random.Random, profile: WorkloadProfile) -> float:
    mu, sigma = lognormal_params(profile.sandbox_start_median_s, profile.sandbox_start_p99_s)
    return rng.lognormvariate(mu, sigma)


def sample_llm_call_s(rng: random.Random, profile: WorkloadProfile) -> float:
    return rng.lognormvariate(llm_mu(profile), profile.llm_call_sigma)


def sample_tool_s(rng: random.Random, profile: WorkloadProfile) -> float:
    return rng.lognormvariate(math.log(profile.tool_median_s), profile.tool_sigma)


def sample_verifier_s(rng: random.Random, profile: WorkloadProfile) -> float:
    return rng.lognormvariate(math.log(profile.verifier_median_s), profile.verifier_sigma)


def clamp_turns(raw: float, profile: WorkloadProfile) -> int:
    """Turns of a submitting episode: rounded, at least 1, below the cap."""
    return min(max(round(raw), 1), profile.turn_cap - 1)


def sample_turns(rng: random.Random, profile: WorkloadProfile) -> tuple[int, bool]:
    """(turns, submits): capped episodes run `turn_cap` turns and never submit."""
    if rng.random() < profile.capped_fraction:
        return profile.turn_cap, False
    raw = rng.lognormvariate(math.log(profile.submitted_median_turns), profile.submitted_turns_sigma)
    return clamp_turns(raw, profile), True


def plan_episode(key: str, profile: WorkloadProfile) -> EpisodePlan:
    """The plan of the episode named `key` (deterministic: same key, same plan)."""
    rng = random.Random(f"workload:{key}")
    turns, submits = sample_turns(rng, profile)
    resolved = submits and rng.random() < profile.resolved_fraction_of_submitted
    commands = turns if not submits else turns - 1  # the submit turn runs no command
    return EpisodePlan(
        turns=turns,
        submits=submits,
        resolved=resolved,
        sandbox_start_s=sample_sandbox_start_s(rng, profile),
        llm_s=tuple(sample_llm_call_s(rng, profile) for _ in range(turns)),
        tool_s=tuple(sample_tool_s(rng, profile) for _ in range(commands)),
        verifier_s=sample_verifier_s(rng, profile),
    )


def submitted_turns_pmf(profile: WorkloadProfile) -> dict[int, float]:
    """P(turns = k) for a submitting episode, exactly as `sample_turns` draws it."""
    mu, sigma = math.log(profile.submitted_median_turns), profile.submitted_turns_sigma

    def cdf(x: float) -> float:
        return 0.0 if x <= 0 else 0.5 * (1 + math.erf((math.log(x) - mu) / (sigma * math.sqrt(2))))

    pmf: dict[int, float] = {}
    last = profile.turn_cap - 1
    for k in range(1, last + 1):
        low = 0.0 if k == 1 else cdf(k - 0.5)
        high = 1.0 if k == last else cdf(k + 0.5)
        pmf[k] = high - low
    return pmf


def mean_turns(profile: WorkloadProfile) -> float:
    submitted = sum(k * p for k, p in submitted_turns_pmf(profile).items())
    return profile.capped_fraction * profile.turn_cap + (1 - profile.capped_fraction) * submitted


def mean_commands(profile: WorkloadProfile) -> float:
    """Commands run per episode: one per turn, except the submitting turn."""
    return mean_turns(profile) - (1 - profile.capped_fraction)


def mean_episode_s(profile: WorkloadProfile) -> float:
    """Expected unscaled duration of one episode with no overhead (the Little's-law W)."""
    start = lognormal_mean(*lognormal_params(profile.sandbox_start_median_s, profile.sandbox_start_p99_s))
    llm = profile.llm_call_mean_s
    tool = lognormal_mean(math.log(profile.tool_median_s), profile.tool_sigma)
    verifier = lognormal_mean(math.log(profile.verifier_median_s), profile.verifier_sigma)
    return start + mean_turns(profile) * llm + mean_commands(profile) * tool + verifier


def littles_law_bound_per_h(concurrency: int, profile: WorkloadProfile) -> float:
    """Trajectories per (unscaled) hour that `concurrency` slots can finish with no overhead."""
    return concurrency * 3600.0 / mean_episode_s(profile)


def scaled(seconds: float, profile: WorkloadProfile) -> float:
    """Wall seconds a time-scaled simulation spends on `seconds` of workload time."""
    return seconds * profile.time_scale
