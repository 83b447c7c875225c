"""The images a docker factory's sandboxes run: checked once, pulled when missing.

Every pull is counted (`pulls`; failed ones too, since registries count them) and
capped: through the pool's gate when the pool set one (`pull_gate`, which waits and
records the wait on `image_pulls_per_h`), otherwise by refusing pulls past
`pool.image_pulls_per_h` in the last hour (0 = unlimited). Checks are single-flight
per image: starts asking while a check or pull is under way share its outcome, so
concurrent starts of a missing image spend one pull, not one each.
"""

from __future__ import annotations

import asyncio
import collections
import time

from sandboxes.base import PullGate, SandboxStartError
from sandboxes.docker_api import DockerApi, DockerApiError, DockerUnreachableError
from sandboxes.settings import SandboxSettings

BACKEND = "docker"
BUILD_HINT = "for the default image run `.venv/bin/python -m rollstream.launcher.podman image`"
HOUR_S = 3600.0


class ImageKeeper:
    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self.pulls = 0
        self.pull_gate: PullGate | None = None
        self._pull_times: collections.deque[float] = collections.deque()
        self._ready: set[str] = set()
        self._checks: dict[str, asyncio.Future[None]] = {}

    async def ensure(self, api: DockerApi, image: str) -> None:
        if image in self._ready:
            return
        check = self._checks.get(image)
        if check is None:
            check = asyncio.ensure_future(self._check_or_pull(api, image))
            self._checks[image] = check
            check.add_done_callback(lambda done: self._forget(image, done))
        await asyncio.shield(check)  # a caller cancelled by its start timeout leaves it to the rest

    def _forget(self, image: str, check: asyncio.Future[None]) -> None:
        self._checks.pop(image, None)
        if not check.cancelled():
            check.exception()  # retrieved here too, in case every waiter was cancelled

    async def _check_or_pull(self, api: DockerApi, image: str) -> None:
        if not await api.image_exists(image):
            if not self.settings.docker.pull_missing:
                raise SandboxStartError(
                    f"image {image} is not on the docker engine and sandbox.docker.pull_missing is off; "
                    + BUILD_HINT,
                    backend=BACKEND,
                )
            await self._pull(api, image)
        self._ready.add(image)

    async def _pull(self, api: DockerApi, image: str) -> None:
        if self.pull_gate is not None:
            await self.pull_gate()
        else:
            self._check_cap()
        self.pulls += 1
        self._pull_times.append(time.monotonic())
        try:
            await api.pull_image(image, self.settings.docker.pull_timeout_s)
        except (DockerApiError, DockerUnreachableError) as error:
            raise SandboxStartError(
                f"image {image} is missing and pulling it failed ({error}); {BUILD_HINT}", backend=BACKEND
            ) from None

    def _check_cap(self) -> None:
        cap = self.settings.pool.image_pulls_per_h
        now = time.monotonic()
        while self._pull_times and now - self._pull_times[0] > HOUR_S:
            self._pull_times.popleft()
        if 0 < cap <= len(self._pull_times):
            raise SandboxStartError(
                f"image pull cap reached: {len(self._pull_times)} pulls in the last hour "
                f"(pool.image_pulls_per_h={cap}); pre-pull images or raise the cap",
                backend=BACKEND,
            )
