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
