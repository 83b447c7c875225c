"""`sandbox.faults` on real bubblewrap sandboxes: rate 1 injects every time, 0 never (nothing is
wrapped), a seeded rate gives the same set of faults again; hangs are ended by the pool's start
timeout and the backend's own exec deadline, and every injected error is marked injected."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sandboxes.backends import make_factory
from sandboxes.base import BackendUnavailableError, SandboxError, SandboxStartError, SandboxTimeoutError
from sandboxes.bwrap import BwrapSandboxFactory
from sandboxes.faults import FaultySandboxFactory, injects
from sandboxes.pool import SandboxPool
from sandboxes.settings import SandboxFaultSettings, SandboxSettings

pytestmark = pytest.mark.timeout(120)


def with_faults(settings: SandboxSettings, **faults: float) -> SandboxSettings:
    return settings.model_copy(update={"faults": SandboxFaultSettings(**faults)})


async def start_outcomes(settings: SandboxSettings, repo: Path, n: int) -> list[str]:
    """Start `n` sandboxes one after another through a fresh pool: "ok" or the error's kind."""
    factory = make_factory(settings)
    outcomes = []
    async with SandboxPool(settings, factory) as pool:
        for _ in range(n):
            try:
                async with pool.sandbox(repo) as box:
                    assert (await box.exec("cat README.md")).stdout == "sample\n"
                    outcomes.append("ok")
            except SandboxError as error:
                assert error.injected, error
                outcomes.append(error.kind)
    assert isinstance(factory, FaultySandboxFactory)
    assert sum(factory.injected.values()) == sum(o != "ok" for o in outcomes)
    return outcomes


async def test_rate_zero_wraps_nothing(settings: SandboxSettings, repo: Path) -> None:
    factory = make_factory(settings)
    assert isinstance(factory, BwrapSandboxFactory)  # the real backend itself, nothing in between
    async with SandboxPool(settings, factory) as pool, pool.sandbox(repo) as box:
        assert (await box.exec("echo hi")).stdout == "hi\n"


async def test_start_failure_rate_one_fails_every_start(settings: SandboxSettings, repo: Path) -> None:
    outcomes = await start_outcomes(with_faults(settings, start_failure_rate=1.0), repo, 3)
    assert outcomes == ["sandbox_start"] * 3


async def test_a_seeded_rate_injects_the_same_starts_again(settings: SandboxSettings, repo: Path) -> None:
    first = await start_outcomes(with_faults(settings, start_failure_rate=0.5, seed=11), repo, 8)
    again = await start_outcomes(with_faults(settings, start_failure_rate=0.5, seed=11), repo, 8)
    other = [injects(0.5, 12, "start_failure", i) for i in range(8)]
    assert first == again
    assert 0 < first.count("sandbox_start") < 8
    assert [o != "ok" for o in first] != other  # another seed, another set


async def test_start_hang_is_ended_by_the_pool_start_timeout(settings: SandboxSettings, repo: Path) -> None:
    pool_settings = settings.pool.model_copy(update={"start_timeout_s": 2.0})
    hanging = with_faults(settings.model_copy(update={"pool": pool_settings}), hang_rate=1.0)
    factory = make_factory(hanging)
    began = time.monotonic()
    async with SandboxPool(hanging, factory) as pool:
        with pytest.raises(SandboxTimeoutError) as caught:
            async with pool.sandbox(repo):
                pass
        assert pool.stats().running == 0
    assert time.monotonic() - began >= 2.0
    assert caught.value.injected and "not started within 2.0s" in str(caught.value)
    assert isinstance(factory, FaultySandboxFactory) and factory.injected == {"start_hang": 1}


async def test_exec_hang_freezes_the_sandbox_until_the_backends_deadline(
    settings: SandboxSettings, repo: Path
) -> None:
    # a seed whose first start does not hang and whose first exec does
    seed = next(
        s for s in range(1000) if not injects(0.5, s, "start_hang", 0) and injects(0.5, s, "exec_hang", 0, 0)
    )
    bwrap = settings.bwrap.model_copy(update={"server_grace_s": 1.0})
    hanging = with_faults(settings.model_copy(update={"bwrap": bwrap}), hang_rate=0.5, seed=seed)
    factory = make_factory(hanging)
    async with SandboxPool(hanging, factory) as pool:
        with pytest.raises(SandboxTimeoutError) as caught:
            async with pool.sandbox(repo) as box:
                pid = box.inner._process.pid  # type: ignore[attr-defined]
                began = time.monotonic()
                await box.exec("echo never", timeout=1.0)
        waited = time.monotonic() - began
    assert caught.value.injected and "did not answer" in str(caught.value)
    assert waited >= 2.0  # the command's timeout + server_grace_s: the backend's own deadline ended it
    assert not os.path.exists(f"/proc/{pid}") or _state(pid) in ("Z", "X")  # the frozen sandbox was killed
    assert isinstance(factory, FaultySandboxFactory) and factory.injected == {"exec_hang": 1}


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


def test_a_hang_rate_needs_a_backend_that_can_freeze() -> None:
    with pytest.raises(BackendUnavailableError, match="freeze"):
        make_factory(SandboxSettings(backend="simulated", faults=SandboxFaultSettings(hang_rate=0.1)))
    simulated = make_factory(
        SandboxSettings(backend="simulated", faults=SandboxFaultSettings(start_failure_rate=1))
    )
    assert isinstance(simulated, FaultySandboxFactory)


def test_rates_are_checked() -> None:
    with pytest.raises(ValueError):
        SandboxFaultSettings(start_failure_rate=1.5)
    assert not SandboxFaultSettings().active
    assert isinstance(SandboxStartError("x", injected=True).injected, bool)
