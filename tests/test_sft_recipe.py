"""A kept SFT model is reused only while the settings it was made from are unchanged."""

from __future__ import annotations

import json
from pathlib import Path

from rollstream.config import Config, load_config
from rollstream.learning import SFT_RECIPE, learning_paths, sft_model_is_current, sft_recipe


def test_a_kept_sft_model_is_stale_once_the_expert_or_sft_settings_change(tmp_path: Path) -> None:
    def config(*overrides: str) -> Config:
        return load_config(None, [f'run.state_dir="{tmp_path}"', "expert.test_first_rate=0.15", *overrides])

    made_with = config()
    paths = learning_paths(made_with)
    paths.sft_model.mkdir(parents=True)
    (paths.sft_model / "config.json").write_text("{}")
    assert not sft_model_is_current(made_with, paths)  # made before recipes were recorded
    (paths.sft_model / SFT_RECIPE).write_text(json.dumps(sft_recipe(made_with)))
    assert sft_model_is_current(made_with, paths)
    assert sft_model_is_current(config("learning.rl_steps=3", "learning.heldout_tasks=8"), paths)
    for changed in (
        "expert.test_first_rate=0.3",
        "expert.right_edit_rate=0.5",
        "learning.sft_epochs=2",
        "learning.expert_groups_per_task=2",
        "learning.train_tasks=64",
    ):
        assert not sft_model_is_current(config(changed), paths)


def test_a_pretrained_base_has_its_own_learning_directory_and_settings(tmp_path: Path) -> None:
    """`--model NAME` runs under learning/<name>/seed-S with the known model's directory as base, after
    the family's settings and the pretrained ones (user --set overrides still come last)."""
    from rollstream.learning import PRETRAINED_DEFAULTS, learning_overrides

    small = load_config(None, [f'run.state_dir="{tmp_path}"', *learning_overrides(None)])
    assert learning_paths(small).root == tmp_path / "learning" / "seed-0"
    assert learning_paths(small).base_model == tmp_path / "learning" / "seed-0" / "base"
    overrides = learning_overrides("smollm2-135m-instruct")
    assert overrides[-1] == 'learning.base_model="smollm2-135m-instruct"'
    assert set(PRETRAINED_DEFAULTS) <= set(overrides)
    cfg = load_config(None, [f'run.state_dir="{tmp_path}"', *overrides, "learning.seed=3"])
    paths = learning_paths(cfg)
    assert paths.root == tmp_path / "learning" / "smollm2-135m-instruct" / "seed-3"
    assert paths.base_model == tmp_path / "models" / "smollm2-135m-instruct"
    assert (cfg.engine.dtype, cfg.trainer.dtype, cfg.learning.heldout_tasks, cfg.eval.attempts) == (
        "bfloat16",
        "bfloat16",
        64,
        4,
    )
    assert sft_recipe(cfg)["base_model"] == "smollm2-135m-instruct"  # another base: another SFT model
