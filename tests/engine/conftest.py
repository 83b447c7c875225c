"""Fixtures for engine tests: one small model directory (~0.9M parameters) per session and
engines started and stopped around each test."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agents.engine.engine import Engine
from agents.settings import EngineSettings
from trainer.checkpoint import init_model_dir, load_model, save_model
from trainer.model import build_model
from trainer.settings import ModelSettings

EngineFactory = Callable[..., Engine]


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(ModelSettings(), tmp_path_factory.mktemp("engine-model") / "m")


@pytest.fixture(scope="session")
def updated_model_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture, different weights, weight version 7."""
    path = tmp_path_factory.mktemp("engine-model-v7") / "m"
    shutil.copytree(model_dir, path)
    save_model(build_model(load_model(model_dir).config, seed=99), path, weight_version=7)
    return path


@pytest.fixture
def make_engine(model_dir: Path) -> Iterator[EngineFactory]:
    started: list[Engine] = []

    def make(**overrides: object) -> Engine:
        settings = EngineSettings(**{"context_length": 4096, "torch_threads": 1, **overrides})
        engine = Engine(model_dir, settings).start()
        started.append(engine)
        return engine

    yield make
    for engine in started:
        engine.stop()


def wait_until(condition: Callable[[], bool], timeout: float = 60.0, what: str = "condition") -> None:
    """Poll with a generous deadline: the machine is shared and slow."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)
