"""`sandbox.faults.hang_rate` on the docker backend (podman's real API): an injected exec hang
pauses the real container, and the backend's own handling of a paused container (the engine
refuses the exec at once, or it runs past command timeout + exec_grace_s) ends it as an
injected `SandboxTimeoutError`; the paused container is still removed."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from sandboxes.base import SandboxTimeoutError
from sandboxes.docker import DockerSandboxFactory
from sandboxes.docker_api import DockerApi
from sandboxes.faults import FaultySandboxFactory, injects, with_faults
from sandboxes.settings import SandboxFaultSettings

pytestmark = pytest.mark.timeout(180)


async def test_an_injected_exec_hang_pauses_the_container_until_the_deadline(
    make_factory: Callable[..., DockerSandboxFactory], raw_api: DockerApi
) -> None:
    seed = next(
        s for s in range(1000) if not injects(0.5, s, "start_hang", 0) and injects(0.5, s, "exec_hang", 0, 0)
    )
    real = make_factory(docker={"exec_grace_s": 1.0})
    factory = with_faults(real, SandboxFaultSettings(hang_rate=0.5, seed=seed))
    assert isinstance(factory, FaultySandboxFactory)
    box = factory.create(None)
    await box.start()
    try:
        began = time.monotonic()
        with pytest.raises(SandboxTimeoutError) as caught:
            await box.exec("echo never", timeout=1)
        assert time.monotonic() - began < 30.0  # never longer than the backend's own deadline allows
        assert caught.value.injected and "paused" in str(caught.value)
        state = await raw_api.inspect_container(box.inner.container_id)  # type: ignore[attr-defined]
        assert state["State"]["Paused"]  # really frozen, not a simulated error
        assert factory.injected == {"exec_hang": 1}
    finally:
        await box.stop()
    assert not await raw_api.list_containers([f"rollstream.sandbox.run={real.run_id}"])
