"""`make_factory(settings)`: the sandbox factory of the configured backend.

Backends are imported lazily by name, so a machine without the docker or e2b
SDKs (or without bubblewrap) can still use the others.
"""

from __future__ import annotations

from sandboxes.base import BackendUnavailableError, SandboxFactory
from sandboxes.settings import SandboxSettings

BACKENDS = ("bwrap", "docker", "e2b", "simulated")


def make_factory(settings: SandboxSettings) -> SandboxFactory:
    """A factory for `settings.backend`; `BackendUnavailableError` when it cannot run here."""
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
