"""SFT with the trainer's code: `rollstream train --sft DATASET --out DIR` learns, then RL starts from it."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from rollstream.config import Config
from streams.datasets import write_rows
from streams.eventgen.groups import GroupLogSpec
from tests.trainer.trainer_log import (
    FAST_TRAINER,
    TINY_MODEL,
    invoke_train,
    make_model,
    read_steps,
    settings_args,
    write_log,
)
from trainer.checkpoint import load_model, weight_version
from trainer.sft import read_sft_dataset
from trainer.versions import directory_sha256, version_dir


def _sft_rows(count: int) -> list[dict[str, object]]:
    """Rows as `rollstream replay --dataset sft` writes them: a prompt, then a fixed answer to learn."""
    rng = random.Random(0)
    rows = []
    for index in range(count):
        prompt = [rng.randrange(3, 300) for _ in range(6)]
        answer = [7, 8, 9, 10, 11, 12, 13, 14] * 2
        rows.append(
            {
                "run_id": "base",
                "task_id": f"t{index}",
                "trajectory_id": f"tr{index}",
                "messages": [{"role": "user", "content": "?"}],
                "input_ids": prompt + answer,
                "loss_mask": [0] * len(prompt) + [1] * len(answer),
                "reward": 1.0,
                "turns": 1,
            }
        )
    return rows


def test_sft_loss_falls_and_its_last_version_starts_rl(
    config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    overrides = (*TINY_MODEL, *FAST_TRAINER, "trainer.sft_lr=0.03", "trainer.sft_batch_sequences=4")
    cfg = config_factory(*overrides)
    make_model(cfg)
    jsonl, parquet = tmp_path / "sft.jsonl", tmp_path / "sft.parquet"
    write_rows(_sft_rows(8), jsonl)
    write_rows(_sft_rows(8), parquet)
    assert read_sft_dataset(parquet, 300) == read_sft_dataset(jsonl, 300)
    config_args = (
        f'kafka.bootstrap="{cfg.kafka.bootstrap}"',
        f'topics.prefix="{cfg.topics.prefix}"',
        f'run.state_dir="{cfg.run.state_dir}"',
        *overrides,
    )
    out = tmp_path / "sft-out"

    result = invoke_train(
        "--run",
        "sft-run",
        "--sft",
        str(parquet),
        "--out",
        str(out),
        "--epochs",
        "5",
        *settings_args(*config_args),
    )
    assert result.exit_code == 0, result.output

    steps = [r.event.data for r in read_steps(cfg)]
    assert [s.step for s in steps] == list(range(1, 11)) and {s.mode for s in steps} == {"sft"}  # type: ignore[attr-defined]
    losses = [s.loss for s in steps]  # type: ignore[attr-defined]
    assert losses[-1] < 0.6 * losses[0], losses
    last = version_dir(out, "sft-run", 10)
    assert weight_version(last) == 10 and load_model(last).num_parameters() > 0
    assert directory_sha256(last)

    write_log(cfg, GroupLogSpec(run_id="rl-run", groups=4, vocab_size=300))
    # the log's groups come from version 0; at version 10 they would be stale
    rl_args = settings_args(
        *config_args, "trainer.groups_per_step=2", "policy.max_staleness=-1", f'model.path="{last}"'
    )
    result = invoke_train("--run", "rl-run", "--steps", "1", *rl_args)
    assert result.exit_code == 0, result.output
    first_rl = version_dir(cfg.weights_dir, "rl-run", 11)  # RL continues the SFT version numbers
    assert weight_version(first_rl) == 11
