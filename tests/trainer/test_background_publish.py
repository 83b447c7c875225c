"""Publishing off the step path: one publish at a time, its failure not lost, and the weights it
writes are those of its step even while the next step trains."""

from __future__ import annotations

import asyncio

import pytest
import torch

from trainer.background_publish import BackgroundPublisher
from trainer.settings import LoraSettings, TrainerSettings

from .test_lora_and_dtype import LORA, backend
from .test_step import batch_of_samples


def test_publishes_run_one_at_a_time_in_order() -> None:
    order: list[str] = []

    async def publish(name: str, delay: float) -> None:
        order.append(f"{name} started")
        await asyncio.sleep(delay)
        order.append(f"{name} done")

    async def scenario() -> None:
        publisher = BackgroundPublisher()
        publisher.start(publish("v1", 0.05))
        assert publisher.busy
        with pytest.raises(RuntimeError, match="drain"):
            publisher.start(publish("v2", 0))  # refused: v1 is still pending
        await publisher.drain()
        publisher.start(publish("v2", 0))
        await publisher.drain()
        assert not publisher.busy

    asyncio.run(scenario())
    assert order == ["v1 started", "v1 done", "v2 started", "v2 done"]


def test_a_failed_publish_is_raised_by_the_next_drain() -> None:
    async def failing() -> None:
        raise OSError("disk full")

    async def scenario() -> None:
        publisher = BackgroundPublisher()
        publisher.start(failing())
        await asyncio.sleep(0)
        with pytest.raises(OSError, match="disk full"):
            await publisher.drain()
        await publisher.drain()  # raised once, then nothing is pending

    asyncio.run(scenario())


def test_close_cancels_a_publish_cut_off_by_an_error() -> None:
    finished: list[bool] = []

    async def slow() -> None:
        await asyncio.sleep(10)
        finished.append(True)

    async def scenario() -> None:
        publisher = BackgroundPublisher()
        publisher.start(slow())
        await publisher.close()
        assert not publisher.busy

    asyncio.run(scenario())
    assert finished == []


@pytest.mark.parametrize("lora", [LoraSettings(), LORA], ids=["full", "lora"])
def test_the_weights_taken_for_a_version_do_not_follow_the_next_step(lora: LoraSettings) -> None:
    trainer = backend(TrainerSettings(lr=1e-2, lora=lora))
    trainer.rl_step(batch_of_samples())
    taken = trainer.hf_state_dict()
    kept = {name: t.clone() for name, t in taken.items()}
    trainer.rl_step(batch_of_samples())  # the next step, while the version would be written
    after = trainer.hf_state_dict()
    assert all(torch.equal(taken[name], kept[name]) for name in kept)
    assert any(not torch.equal(after[name], kept[name]) for name in kept)  # the model did move on
