"""Bad model directories are refused at load, before any process starts, naming the file and field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollstream.cli import app
from sandboxes.tasks.family import write_family
from trainer.checkpoint import ModelDirError, check_model_dir, init_model_dir
from trainer.settings import ModelSettings

SMALL = ModelSettings(
    vocab_size=512, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_model_dir(SMALL, tmp_path_factory.mktemp("good") / "model")


def broken(good: Path, tmp_path: Path, remove: str = "", config: dict | None = None) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(good, copy)
    if remove:
        (copy / remove).unlink()
    if config is not None:
        raw = json.loads((copy / "tokenizer_config.json").read_text())
        (copy / "tokenizer_config.json").write_text(json.dumps({**raw, **config}))
    return copy


def test_a_good_directory_passes(good: Path) -> None:
    assert check_model_dir(good).model.vocab_size == 512


@pytest.mark.parametrize(
    ("remove", "config", "named"),
    [
        ("tokenizer.json", None, "tokenizer.json"),
        ("", {"chat_template": None}, "chat_template"),
        ("model.safetensors", None, "model.safetensors"),
        ("config.json", None, "config.json"),
    ],
)
def test_what_is_missing_is_named(
    good: Path, tmp_path: Path, remove: str, config: dict | None, named: str
) -> None:
    with pytest.raises(ModelDirError, match=named):
        check_model_dir(broken(good, tmp_path, remove, config))


def test_a_dtype_the_machine_cannot_run_is_refused(good: Path) -> None:
    with pytest.raises(ModelDirError, match="float8"):
        check_model_dir(good, dtype="float8")


def test_commands_refuse_before_starting_anything(good: Path, tmp_path: Path) -> None:
    """`rollstream eval` with a directory lacking its template exits 1 with the reason, no engine started."""
    model = broken(good, tmp_path, config={"chat_template": None})
    tasks = tmp_path / "tasks"
    write_family(tasks, "heldout", 1, 0)
    result = CliRunner().invoke(app, ["eval", "--model", str(model), "--tasks", str(tasks)])
    assert result.exit_code == 1
    said = " ".join(result.output.split())
    assert "has no `chat_template`" in said and "engine" not in said
