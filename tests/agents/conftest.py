"""Fixtures of the agents tests: a locally trained tokenizer and its chat format, an event sink
that collects what an episode emits, and for the rollout worker process tests (one per module)
a tiny model, the embedded engine serving it and a one-task root."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from agents.chat import ChatFormat
from streams.events import Event
from tests.agents.rollout_worker_process import ENGINE_CLI, MODEL_CLI, TINY_MODEL, free_port, wait_until
from trainer.tokenizer import train_tokenizer


class Collected:
    """An episode's event sink that keeps every event in order."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    async def emit(self, event: Event) -> None:
        self.events.append(event)

    def types(self) -> list[str]:
        return [e.type for e in self.events]


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return train_tokenizer(1024)


@pytest.fixture(scope="session")
def chat(tokenizer: Tokenizer) -> ChatFormat:
    return ChatFormat.for_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("agents-model") / "model"
    sets = [arg for item in TINY_MODEL for arg in ("-s", item)]
    subprocess.run([*MODEL_CLI, "init", "--out", str(out), *sets], check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def engine_url(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    log = (tmp_path_factory.mktemp("engine-log") / "engine.log").open("w")
    proc = subprocess.Popen(
        [*ENGINE_CLI, "serve", "--model", str(model_dir), "--port", str(port), "--context-length", "4096"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        assert proc.poll() is None, f"engine exited with {proc.returncode}; see {log.name}"
        try:
            return httpx.get(f"{url}/get_model_info", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_until(healthy, "the engine to serve", timeout=120)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def one_task_root(default_tasks_dir: Path, tmp_path: Path) -> Path:
    """A task root holding one default task (the worker resolves tasks by directory name)."""
    first = sorted(d for d in default_tasks_dir.iterdir() if (d / "task.toml").is_file())[0]
    root = tmp_path / "tasks"
    shutil.copytree(first, root / first.name, symlinks=True)
    return root
