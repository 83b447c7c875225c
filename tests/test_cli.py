"""The root CLI: every area is registered, and a command imports only what it needs."""

from __future__ import annotations

import subprocess
import sys

from rollstream.cli import SINGLE_COMMANDS, SUB_APPS, _requested


def test_only_the_named_command_is_loaded() -> None:
    assert _requested(["rollstream", "sql", "SELECT 1"]) == {"sql"}
    assert _requested(["rollstream", "kafka", "up", "--brokers", "3"]) == {"kafka"}
    assert _requested(["rollstream", "--help"]) is None
    assert _requested(["rollstream", "no-such-command"]) is None  # the error lists every command


def test_help_lists_every_command_and_sql_runs_without_torch() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "rollstream", "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
    )
    assert shown.returncode == 0, shown.stderr
    for _, name in (*SUB_APPS, *SINGLE_COMMANDS):
        assert f" {name} " in shown.stdout
    probe = (
        "import sys, runpy; sys.argv = ['rollstream', 'config', 'show']; "
        "runpy.run_module('rollstream', run_name='__main__'); assert 'torch' not in sys.modules"
    )
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
