"""The sandbox image: built once from Debian packages, cached, imported idempotently."""

from __future__ import annotations

from pathlib import Path

from rollstream.config import Config
from rollstream.launcher import podman
from sandboxes.docker_api import DockerApi
from sandboxes.image import ensure_image, tarball_name
from sandboxes.settings import DockerSettings


async def test_ensure_image_is_idempotent_and_reimports_from_the_cache(
    base_config: Config, podman_url: str, raw_api: DockerApi
) -> None:
    again = podman.ensure_image(base_config)
    assert (again.built, again.imported) == (False, False)

    settings = base_config.sandbox.docker.model_copy(update={"image": "rollstream-sandbox-test:reimport"})
    cache = base_config.state_dir / "images"
    # The image may come from this machine's podman storage (another checkout built it);
    # then there is no cached root filesystem yet and this call builds one.
    cached = (cache / tarball_name(settings)).exists()
    try:
        report = ensure_image(settings, podman_url, cache, log=lambda _: None)
        assert (report.built, report.imported) == (not cached, True)
        assert (cache / tarball_name(settings)).exists()
        assert await raw_api.image_exists("rollstream-sandbox-test:reimport")
    finally:
        await raw_api.request("DELETE", "/images/rollstream-sandbox-test:reimport")


def test_tarball_name_follows_the_settings_that_shape_the_image(tmp_path: Path) -> None:
    base = DockerSettings()
    assert tarball_name(base) == tarball_name(DockerSettings(image="other:tag"))
    assert tarball_name(base) != tarball_name(DockerSettings(image_packages=("python3", "git")))
    assert tarball_name(base) != tarball_name(DockerSettings(debian_suite="trixie"))
