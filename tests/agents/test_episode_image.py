"""A task that names its own image (`[environment] docker_image`, e.g. SWE-bench) asks the
sandbox pool for a sandbox of that image, so the pool keeps that image warm; a backend that
runs no images makes it an infrastructure error, never a score."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

from agents.chat import ChatFormat
from agents.episode import Episode
from sandboxes.base import Sandbox
from sandboxes.pool import SandboxPool
from sandboxes.settings import SandboxSettings
from sandboxes.simulated import SimulatedSandboxFactory
from sandboxes.tasks.harbor import EnvironmentSpec
from streams.outcomes import Outcome
from tests.agents.conftest import Collected
from tests.agents.test_episode import FAST, SUBMIT, DirectSandboxes, bash, make_episode

IMAGE = "swebench/sweb.eval.x86_64.owner_1776_repo-1:latest"


class ImageRecordingSandboxes(DirectSandboxes):
    def __init__(self, factory: SimulatedSandboxFactory) -> None:
        super().__init__(factory)
        self.images: list[str | None] = []

    @asynccontextmanager
    async def sandbox(self, workspace: Path | None, image: str | None = None) -> AsyncIterator[Sandbox]:
        self.images.append(image)
        async with super().sandbox(workspace) as box:
            yield box


def in_own_image(episode: Episode, sandboxes: object) -> Episode:
    task = replace(episode.spec.task, environment=EnvironmentSpec(docker_image=IMAGE))
    return Episode(
        replace(episode.spec, task=task), replace(episode.services, sandboxes=sandboxes), Collected()
    )


async def test_the_episode_asks_for_the_tasks_image(chat: ChatFormat) -> None:
    episode, _ = make_episode(chat, [bash(SUBMIT)])
    sandboxes = ImageRecordingSandboxes(SimulatedSandboxFactory(FAST))
    finished = await in_own_image(episode, sandboxes).run()
    assert sandboxes.images == [IMAGE] and finished.outcome == Outcome.RESOLVED


async def test_a_backend_without_images_is_an_infra_error_never_scored(chat: ChatFormat) -> None:
    episode, _ = make_episode(chat, [bash(SUBMIT)])
    settings = SandboxSettings()
    async with SandboxPool(settings, SimulatedSandboxFactory(FAST)) as pool:
        finished = await in_own_image(episode, pool).run()
    assert finished.outcome == Outcome.INFRA_SANDBOX_START and finished.reward is None
