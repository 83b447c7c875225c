"""`rollstream train`: help, clear errors for bad input, and SIGTERM (checkpoint, exit 0)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from typer.testing import Result

from rollstream.config import Config
from streams.eventgen.groups import GroupLogSpec
from tests.trainer.trainer_log import (
    FAST_TRAINER,
    TINY_MODEL,
    invoke_train,
    make_model,
    settings_args,
    write_log,
)
from trainer.resume import Checkpoint, checkpoint_path, load_checkpoint, save_checkpoint

OVERRIDES = (*TINY_MODEL, *FAST_TRAINER, "trainer.groups_per_step=2")


def said(result: Result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def _args(cfg: Config, *extra: str) -> list[str]:
    return settings_args(
        f'kafka.bootstrap="{cfg.kafka.bootstrap}"',
        f'topics.prefix="{cfg.topics.prefix}"',
        f'run.state_dir="{cfg.run.state_dir}"',
        *OVERRIDES,
        *extra,
    )


def test_help_says_what_each_flag_does() -> None:
    result = invoke_train("--help")
    assert result.exit_code == 0
    for flag in ("--run", "--steps", "--sft", "--out", "--epochs", "--checkpoint"):
        assert flag in result.output


def test_bad_input_gets_a_clear_error(config_factory: Callable[..., Config], tmp_path: Path) -> None:
    cfg = config_factory(*OVERRIDES, create_topics=False)
    make_model(cfg)

    no_model = invoke_train("--run", "r", *_args(cfg, f'model.path="{tmp_path / "nothing"}"'))
    assert no_model.exit_code == 1 and "neither a model directory nor a known model" in said(no_model)
    foreign_arch = tmp_path / "mistral"
    shutil.copytree(cfg.model_dir, foreign_arch)
    raw = json.loads((foreign_arch / "config.json").read_text())
    (foreign_arch / "config.json").write_text(json.dumps({**raw, "architectures": ["MistralForCausalLM"]}))
    wrong_model = invoke_train("--run", "r", *_args(cfg, f'model.path="{foreign_arch}"'))
    assert wrong_model.exit_code == 1 and "field `architectures`" in said(wrong_model)

    foreign = tmp_path / "other.pt"
    save_checkpoint(foreign, Checkpoint(run_id="other", mode="rl", version=3, step=3, model_shape={}))
    other_run = invoke_train("--run", "mine", "--checkpoint", str(foreign), *_args(cfg))
    assert other_run.exit_code == 1 and "checkpoint of run 'other'" in said(other_run)

    not_sft = tmp_path / "rows.jsonl"
    not_sft.write_text(json.dumps({"group_id": "g", "rewards": [1.0]}) + "\n")
    result = invoke_train("--sft", str(not_sft), "--out", str(tmp_path / "o"), *_args(cfg))
    assert result.exit_code == 1 and "not an SFT dataset" in said(result)
    missing_out = invoke_train("--sft", str(not_sft), *_args(cfg))
    assert missing_out.exit_code == 2 and "--sft needs --out" in said(missing_out)


def test_sigterm_checkpoints_and_exits_0(config_factory: Callable[..., Config]) -> None:
    cfg = config_factory(*OVERRIDES)
    make_model(cfg)
    write_log(cfg, GroupLogSpec(run_id="term", groups=3, vocab_size=300))  # one step, then it waits for more
    command = [sys.executable, "-m", "rollstream", "train", "--run", "term", *_args(cfg)]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    timer = threading.Timer(300, process.kill)
    timer.start()
    lines = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)
            if "phase=between step=1" in line:
                process.send_signal(signal.SIGTERM)
        process.wait()
    finally:
        timer.cancel()
    assert process.returncode == 0, "".join(lines)
    saved = load_checkpoint(
        checkpoint_path(cfg.state_dir, "term"), run_id="term", mode="rl", model_shape=_shape(cfg)
    )
    assert saved is not None and (saved.step, saved.version) == (1, 1)
    assert sum(saved.offsets["groups"].values()) == 2  # the third group waits for a batch: read again


def _shape(cfg: Config) -> dict[str, object]:
    import dataclasses

    from trainer.model import ModelConfig

    return dataclasses.asdict(ModelConfig.from_settings(cfg.model))
