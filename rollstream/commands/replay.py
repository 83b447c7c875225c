"""`rollstream replay`: rebuild a run's datasets from the log, or check the recorded topics.

`--dataset sft|rl|trajectories --out FILE(.jsonl|.parquet)` replays the run with
its recorded policies (the ones on its groups), with any `--set policy.KEY=...`
taking precedence, and writes the dataset. `--compare` replays with the recorded
policies and lists every difference from the recorded `trajectories` and `groups`
topics (exit 1 when there is any). `--from-db` reads the SQL store's `events`
table instead of the topics: it keeps every run's copy of a trajectory (a killed
rollout worker's partial copy and its re-run), so the replay is the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Literal

import typer
from rich.table import Table

from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config
from rollstream.config import Config
from rollstream.recorded_runs import load_run, policies
from streams.datasets import DatasetError, Decode, rl_rows, sft_rows, trajectory_rows, write_rows
from streams.policies import cut_limits, explicit_policy_keys
from streams.replay import RecordedRun, compare, load_from_topics, replay

Dataset = Literal["sft", "rl", "trajectories"]


def command(
    run: str = typer.Option(..., "--run", help="run id"),
    dataset: Dataset | None = typer.Option(None, "--dataset", help="sft | rl | trajectories"),
    out: Path | None = typer.Option(None, "--out", help="output file, .jsonl or .parquet"),
    compare_topics: bool = typer.Option(False, "--compare", help="compare with the recorded topics"),
    from_db: bool = typer.Option(False, "--from-db", help="read the SQL store's events table"),
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Replay a run from the log into a dataset, or compare a replay with the recorded topics."""
    cfg = read_config(config, overrides)
    if not compare_topics and (dataset is None or out is None):
        fail("give --dataset and --out (or --compare)", code=2)
    recorded = load_run(cfg, run, from_db)
    if compare_topics:
        _compare(cfg, recorded, from_db)
        return
    assert dataset is not None and out is not None
    _, policy = policies(cfg, recorded, overrides or [])
    result = replay(recorded, policy, cut_limits(policy, explicit_policy_keys(overrides or [])))
    if dataset == "sft":
        rows = sft_rows(result.folded, _decoder(cfg))
    elif dataset == "rl":
        rows = rl_rows(result.trajectories, result.groups)
    else:
        rows = trajectory_rows(result.trajectories)
    try:
        write_rows(rows, out)
    except DatasetError as error:
        fail(str(error), code=2)
    console.print(f"wrote {len(rows)} {dataset} rows of run {run} to {out}")


def _compare(cfg: Config, recorded: RecordedRun, from_db: bool) -> None:
    if from_db:  # the store keeps groups but not trajectories: compare those against the topics
        topics = asyncio.run(load_from_topics(cfg.kafka, cfg.topics, recorded.run_id))
        recorded = dataclasses.replace(recorded, trajectories=topics.trajectories)
    policy, _ = policies(cfg, recorded, [])
    result = replay(recorded, policy)
    differences = compare(recorded.trajectories, result.trajectories, "trajectories")
    differences += compare(recorded.groups, result.groups, "groups")
    table = Table(title=f"replay of {recorded.run_id} with the recorded policies")
    for column in ("topic", "recorded", "replayed", "differences"):
        table.add_column(column, justify="right")
    for label, old, new in (
        ("trajectories", recorded.trajectories, result.trajectories),
        ("groups", recorded.groups, result.groups),
    ):
        table.add_row(label, str(len(old)), str(len(new)), str(sum(d.startswith(label) for d in differences)))
    console.print(table)
    for line in differences[:50]:
        console.print(f"  {line}")
    if differences:
        fail(f"{len(differences)} differences between the replay and the recorded topics")
    console.print("no differences")


def _decoder(cfg: Config) -> Decode | None:
    """The model's tokenizer decode, when the model directory has one; else messages show commands."""
    try:
        from trainer.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(cfg.model_dir)
    except (FileNotFoundError, ImportError, OSError):
        return None
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
