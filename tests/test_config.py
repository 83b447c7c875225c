"""The one config: TOML file, --set overrides, clear errors, `config show` round-trips."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollstream.cli import app
from rollstream.config import Config, ConfigError, load_config


def test_defaults_are_the_reference_run() -> None:
    config = load_config(None, [])
    assert config.policy.max_turns == 80
    assert config.policy.max_new_tokens_per_turn == 8192
    assert config.policy.max_trajectory_tokens == 65536
    assert config.policy.context_cap == 65536
    assert config.policy.tool_output_chars == 10000
    assert config.policy.group_size == 8
    assert config.policy.infra_error_retries == 2
    assert config.policy.min_valid_attempts == 2


def test_file_then_overrides(tmp_path: Path) -> None:
    file = tmp_path / "rollstream.toml"
    file.write_text('[policy]\nmax_turns = 40\n[sandbox.pool]\nwarm_pool = 4\n[run]\nname = "r1"\n')
    config = load_config(file, ["policy.max_turns=20", "policy.overlong=drop"])
    assert config.policy.max_turns == 20  # --set wins over the file
    assert config.policy.overlong == "drop"  # bare words are strings
    assert config.sandbox.pool.warm_pool == 4
    assert config.run.name == "r1"


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        (["policy.max_turns=many"], "policy.max_turns"),
        (["policy.no_such_key=1"], "policy.no_such_key"),
        (["policy"], "KEY=VALUE"),
        (["policy.overlong=sometimes"], "policy.overlong"),
    ],
)
def test_bad_overrides_name_the_key(overrides: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(None, overrides)


def test_bad_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[policy\nmax_turns = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_config_is_frozen() -> None:
    config = load_config(None, [])
    with pytest.raises(ValueError):
        config.policy.max_turns = 3  # type: ignore[misc]


def test_config_show_round_trips(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["config", "show", "--set", "policy.max_turns=33"])
    assert result.exit_code == 0, result.output
    shown = tomllib.loads(result.output)
    assert Config.model_validate(shown) == load_config(None, ["policy.max_turns=33"])


def test_config_show_reports_bad_override() -> None:
    result = CliRunner().invoke(app, ["config", "show", "--set", "policy.max_turns=x"])
    assert result.exit_code == 2
    assert "policy.max_turns" in result.output
