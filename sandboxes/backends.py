"""`make_factory(settings)`: the sandbox factory of the configured backend.

Backends are imported lazily by name, so a machine without the docker or e2b
SDKs (or without bubblewrap) can still use the others. When `settings.faults` sets
any rate above 0 the real factory comes wrapped in `sandboxes.faults` (fault
injection); with the defaults it is returned as is.
"""

from __future__ import annotations

from sandboxes.base import BackendUnavailableError, SandboxFactory
from sandboxes.faults import with_faults
from sandboxes.settings import SandboxSettings

BACKENDS = ("bwrap", "docker", "e2b", "simulated")


def make_factory(settings: SandboxSettings) -> SandboxFactory:
    """A factory for `settings.backend` (with `settings.faults` injected when any is set);
    `BackendUnavailableError` when it cannot run here."""
    return with_faults(_backend_factory(settings), settings.faults)


def _backend_factory(settings: SandboxSettings) -> SandboxFactory:
    backend = settings.backend
    if backend == "bwrap":
        from sandboxes.bwrap import BwrapSandboxFactory

        return BwrapSandboxFactory(settings)
    if backend == "docker":
        from sandboxes.docker import DockerSandboxFactory

        return DockerSandboxFactory(settings)
    if backend == "e2b":
        from sandboxes.e2b import E2BSandboxFactory

        return E2BSandboxFactory(settings)
    if backend == "simulated":
        from sandboxes.simulated import SimulatedSandboxFactory

        return SimulatedSandboxFactory()
    raise BackendUnavailableError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}")
