"""What every command shares (rollstream/command_line.py): the arguments that hand our config to a
child process, and run ids."""

from __future__ import annotations

import re
from pathlib import Path

from rollstream.command_line import config_args, new_run_id, read_config


def test_config_args_give_a_child_the_same_config(tmp_path: Path) -> None:
    file = tmp_path / "rollstream.toml"
    file.write_text("[policy]\nmax_turns = 7\n")
    overrides = ["policy.group_size=4", 'topics.prefix="x-"']
    args = config_args(file, overrides)
    assert args == ["--config", str(file), "--set", overrides[0], "--set", overrides[1]]
    assert config_args(None, None) == []
    # what a child parses from them is the config we read
    child = read_config(Path(args[1]), args[3::2])
    assert child == read_config(file, overrides)
    assert (child.policy.max_turns, child.policy.group_size, child.topics.prefix) == (7, 4, "x-")


def test_run_ids_name_their_kind_sort_by_time_and_differ() -> None:
    ids = {new_run_id("demo") for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"demo-\d{8}-\d{6}-[0-9a-f]{6}", run_id) for run_id in ids)
