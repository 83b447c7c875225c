"""`rollstream sandbox exec`: one command in a fresh sandbox, the ExecResult as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollstream.commands.sandbox import app

pytestmark = pytest.mark.timeout(120)


def test_exec_prints_the_result_as_json(repo: Path) -> None:
    result = CliRunner().invoke(app, ["exec", "--workspace", str(repo), "--", "cat pkg/__init__.py; exit 3"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["exit_code"] == 3
    assert payload["stdout"] == "VALUE = 1\n"
    assert payload["timed_out"] is False and payload["killed_reason"] is None


def test_exec_quotes_several_arguments_and_applies_the_timeout() -> None:
    result = CliRunner().invoke(app, ["exec", "--timeout", "1", "--", "sh", "-c", "echo 'a b'; sleep 30"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout.strip().splitlines()[-1])
    assert payload["stdout"] == "a b\n"
    assert payload["timed_out"] is True and payload["killed_reason"] == "timeout"


def test_exec_rejects_an_unknown_backend() -> None:
    result = CliRunner().invoke(app, ["exec", "--backend", "vm", "--", "true"])
    assert result.exit_code == 2
    assert "unknown backend 'vm'" in result.output
