"""Fixtures for the docker backend against podman's real Docker-compatible API.

The session fixture starts `podman system service` (runc) under the repository's
state dir when it is not answering, builds and imports the sandbox image when the
engine lacks it (CI starts from nothing: about 40 s once, cached afterwards), and
stops the service at the end if this session started it. Every test gets its own
factory with a unique run id; its containers are removed afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from rollstream.config import Config
from rollstream.launcher import podman
from sandboxes.docker import DockerSandbox, DockerSandboxFactory
from sandboxes.docker_api import DockerApi
from sandboxes.settings import SandboxSettings
from tests.sandboxes_docker.busybox_image import ensure_busybox_image


@pytest.fixture(scope="session")
def podman_url(base_config: Config) -> Iterator[str]:
    started_here = not podman.is_up(base_config)
    url = podman.ensure_up(base_config)
    try:
        podman.ensure_image(base_config)
        yield url
    finally:
        if started_here:
            podman.down(base_config)


@pytest.fixture(scope="session")
def no_python_image(podman_url: str, base_config: Config) -> str:
    """An image with busybox alone: no Python, no libc, no coreutils (built once, ~5 s)."""
    return ensure_busybox_image(podman_url, base_config.state_dir / "images", base_config.sandbox.docker)


@pytest.fixture
def docker_settings(podman_url: str) -> Callable[..., SandboxSettings]:
    """SandboxSettings on the podman API; keyword overrides per section, e.g. limits={...}."""

    def make(**sections: dict[str, object]) -> SandboxSettings:
        tree: dict[str, dict[str, object]] = {"docker": {"base_url": podman_url}}
        for section, values in sections.items():
            tree.setdefault(section, {}).update(values)
        return SandboxSettings.model_validate(tree)

    return make


@pytest.fixture
async def raw_api(podman_url: str) -> AsyncIterator[DockerApi]:
    api = DockerApi(podman_url, timeout_s=60.0, max_connections=4)
    yield api
    await api.aclose()


@pytest.fixture
async def make_factory(
    docker_settings: Callable[..., SandboxSettings], raw_api: DockerApi
) -> AsyncIterator[Callable[..., DockerSandboxFactory]]:
    """Factories with a unique run id; every container of that run is removed afterwards."""
    made: list[DockerSandboxFactory] = []

    def make(**sections: dict[str, object]) -> DockerSandboxFactory:
        factory = DockerSandboxFactory(docker_settings(**sections), run_id=f"test-{uuid.uuid4().hex[:8]}")
        made.append(factory)
        return factory

    yield make
    for factory in made:
        await factory.aclose()
        for container in await raw_api.list_containers([f"rollstream.sandbox.run={factory.run_id}"]):
            await raw_api.remove_container(container["Id"])


@pytest.fixture
async def box(
    make_factory: Callable[..., DockerSandboxFactory], tmp_path: Path
) -> AsyncIterator[DockerSandbox]:
    """A started sandbox over a small workspace (`hello.py`, `pkg/data.txt`)."""
    workspace = tmp_path / "repo"
    (workspace / "pkg").mkdir(parents=True)
    (workspace / "hello.py").write_text("print('hello from the workspace')\n")
    (workspace / "pkg" / "data.txt").write_text("42\n")
    sandbox = make_factory().create(workspace)
    await sandbox.start()
    yield sandbox
    await sandbox.stop()
