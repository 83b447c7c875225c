"""Helpers of the trainer tests: a tiny model, a recorded groups/trajectories log, the train CLI."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer
from typer.testing import CliRunner, Result

from rollstream.commands import train
from rollstream.config import Config
from streams.bus import Consumed, EventProducer, read_topic
from streams.eventgen.groups import GroupLogSpec, synthetic_groups
from trainer.checkpoint import init_model_dir
from trainer.versions import version_dir

TINY_MODEL = (
    "model.vocab_size=300",
    "model.hidden_size=16",
    "model.num_layers=1",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=32",
    "model.max_position=256",
)
FAST_TRAINER = (
    "trainer.torch_threads=1",
    "trainer.lr=0.01",
    "trainer.poll_ms=50",
    "trainer.micro_batch_tokens=96",
)


def settings_args(*overrides: str) -> list[str]:
    return [arg for item in overrides for arg in ("--set", item)]


def make_model(cfg: Config) -> Path:
    if not cfg.model_dir.exists():
        init_model_dir(cfg.model, cfg.model_dir)
    return cfg.model_dir


def write_log(cfg: Config, spec: GroupLogSpec) -> list[str]:
    """Write the spec's records to the config's topics; returns the group ids in time order."""

    async def send() -> None:
        async with EventProducer(cfg.kafka, cfg.topics) as producer:
            for topic, event in synthetic_groups(spec):
                await producer.send(topic, event)

    asyncio.run(send())
    return [e.group_id or "" for topic, e in synthetic_groups(spec) if topic == "groups"]


def read_steps(cfg: Config) -> list[Consumed]:
    """`trainer.steps` records, deduplicated by event id (what a consumer sees), in step order."""
    records = asyncio.run(read_topic(cfg.kafka, cfg.topics, "trainer.steps"))
    unique = {r.event.id: r for r in records}
    return sorted(unique.values(), key=lambda r: r.event.data.step)  # type: ignore[attr-defined]


def weights_file(cfg: Config, run_id: str, version: int) -> bytes:
    return (version_dir(cfg.weights_dir, run_id, version) / "model.safetensors").read_bytes()


def invoke_train(*args: str) -> Result:
    """`rollstream train ARGS` in this process (the command alone, without the rest of the CLI)."""
    app = typer.Typer()
    app.command()(train.command)
    return CliRunner().invoke(app, list(args))
