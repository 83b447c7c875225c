"""An image without Python, libc or coreutils for the docker tests: Debian's `busybox-static` alone.

`mmdebstrap --variant=extract` unpacks the one package (no dpkg, no apt, ~2 MB) and a
hook links busybox's applets into /bin, so `sh`, `ls`, `nc`, `tail` exist and nothing
else does: a task image that brings nothing our exec helper could lean on. Built once,
cached next to the default image's root filesystem, imported when the engine lacks it.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
from pathlib import Path

import docker

from sandboxes.image import ImageBuildError, import_tarball
from sandboxes.settings import DockerSettings

IMAGE = "rollstream-busybox:test"
LINK_APPLETS = (
    'for applet in $("$1"/bin/busybox --list); do '
    '[ -e "$1/bin/$applet" ] || ln -s busybox "$1/bin/$applet"; done'
)


def ensure_busybox_image(base_url: str, cache_dir: Path, settings: DockerSettings) -> str:
    client = docker.APIClient(base_url=base_url, version="1.41", timeout=600)
    try:
        if _has(client):
            return IMAGE
        cache_dir.mkdir(parents=True, exist_ok=True)
        with (cache_dir / "build.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            tarball = cache_dir / f"busybox-static-{settings.debian_suite}.tar"
            if not tarball.exists():
                _build(settings, tarball)
            if not _has(client):
                import_tarball(client, tarball, IMAGE)
    finally:
        client.close()
    return IMAGE


def _build(settings: DockerSettings, tarball: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        raise ImageBuildError("mmdebstrap is not installed; run scripts/setup_system.sh")
    partial = tarball.with_suffix(".partial.tar")
    argv = [
        "mmdebstrap",
        "--variant=extract",
        "--include=busybox-static",
        "--quiet",
        f"--extract-hook={LINK_APPLETS}",
        settings.debian_suite,
        str(partial),
        settings.debian_mirror,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise ImageBuildError(f"mmdebstrap (busybox-static) failed: {result.stderr[-2000:]}")
    partial.rename(tarball)


def _has(client: docker.APIClient) -> bool:
    try:
        client.inspect_image(IMAGE)
    except docker.errors.NotFound:
        return False
    return True
