"""Bit-exact resume: `rollstream train` killed with SIGKILL three times ends where an uninterrupted run does.

Over one recorded groups/trajectories log (16 small groups: 3 dropped zero-variance
by the stream policy, 1 that the trainer finds stale at batch time), a subprocess
trainer is killed mid-update, mid-publish (temp dir written, not yet renamed) and
between steps, and restarted each time. Its versions must be byte-identical to an
uninterrupted run's, with the same version numbers, no temp dir left, and the
`trainer.steps` records (deduplicated by id) must train every kept group exactly
once, in the same batches.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from rollstream.config import Config
from streams.eventgen.groups import GroupLogSpec
from tests.trainer.trainer_log import (
    FAST_TRAINER,
    TINY_MODEL,
    invoke_train,
    make_model,
    read_steps,
    settings_args,
    weights_file,
    write_log,
)
from trainer.versions import TEMP_PREFIX, directory_sha256, version_dir

RUN = "resume-run"
STEPS = 6
SPEC = GroupLogSpec(run_id=RUN, groups=16, vocab_size=300, zero_variance_every=5, stale_groups=(11,))
OVERRIDES = (
    *TINY_MODEL,
    *FAST_TRAINER,
    "trainer.groups_per_step=2",
    "trainer.checkpoint_every=2",
    "policy.max_staleness=2",
)
KILLS = ("phase=update step=2", "phase=publish.rename step=3", "phase=between step=5")
DEADLINE_S = 300  # generous: a loaded 2-core machine takes ~30 s just to import torch


def _start(cfg: Config) -> subprocess.Popen[str]:
    command = [
        sys.executable,
        "-m",
        "rollstream",
        "train",
        "--run",
        RUN,
        "--steps",
        str(STEPS),
        *settings_args(*_config_args(cfg), "trainer.phase_pause_s=0.3"),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, stderr=subprocess.STDOUT, stdout=subprocess.PIPE, text=True, env=env)


def _config_args(cfg: Config) -> tuple[str, ...]:
    return (
        f'kafka.bootstrap="{cfg.kafka.bootstrap}"',
        f'topics.prefix="{cfg.topics.prefix}"',
        f'run.state_dir="{cfg.run.state_dir}"',
        *OVERRIDES,
    )


def _run_until(process: subprocess.Popen[str], marker: str | None, lines: list[str]) -> None:
    """Read the process's output; SIGKILL it on the line containing `marker` (None: let it finish)."""
    assert process.stdout is not None
    timer = threading.Timer(DEADLINE_S, process.kill)
    timer.start()
    try:
        for line in process.stdout:
            lines.append(line)
            if marker is not None and marker in line:
                process.send_signal(signal.SIGKILL)
                break
        process.wait()
    finally:
        timer.cancel()
    if marker is not None:
        assert process.returncode == -signal.SIGKILL, "".join(lines[-30:])
    else:
        assert process.returncode == 0, "".join(lines[-30:])


def test_sigkill_three_times_matches_an_uninterrupted_run(
    config_factory: Callable[..., Config], tmp_path: Path
) -> None:
    reference = config_factory(f'run.state_dir="{tmp_path / "reference"}"', *OVERRIDES)
    killed = config_factory(f'run.state_dir="{tmp_path / "killed"}"', *OVERRIDES)
    make_model(reference)
    make_model(killed)
    group_ids = write_log(reference, SPEC)
    write_log(killed, SPEC)

    result = invoke_train("--run", RUN, "--steps", str(STEPS), *settings_args(*_config_args(reference)))
    assert result.exit_code == 0, result.output

    lines: list[str] = []
    for marker in (*KILLS, None):
        _run_until(_start(killed), marker, lines)
    output = "".join(lines)
    assert output.count("resumed run") == 2, output  # the first kill came before any checkpoint
    assert "removed" in output and TEMP_PREFIX in output, output  # the half-written version

    for version in range(1, STEPS + 1):
        assert weights_file(killed, RUN, version) == weights_file(reference, RUN, version), version
        assert directory_sha256(version_dir(killed.weights_dir, RUN, version)) == directory_sha256(
            version_dir(reference.weights_dir, RUN, version)
        )
    run_dir = killed.weights_dir / RUN
    assert sorted(p.name for p in run_dir.iterdir()) == [f"{v:06d}" for v in range(1, STEPS + 1)]
    assert weights_file(killed, RUN, 1) != weights_file(killed, RUN, STEPS)  # it did train

    steps, expected_steps = read_steps(killed), read_steps(reference)
    assert [r.event.data.step for r in steps] == list(range(1, STEPS + 1))  # type: ignore[attr-defined]
    trained = [g for r in steps for g in r.event.data.group_ids]  # type: ignore[attr-defined]
    assert trained == [g for r in expected_steps for g in r.event.data.group_ids]  # type: ignore[attr-defined]
    dropped = {group_ids[i] for i in (4, 9, 14)}
    stale = {group_ids[11]}
    assert trained == [g for g in group_ids if g not in dropped | stale]  # each once, in time order
    counts = [(r.event.data.zero_variance_groups, r.event.data.stale_groups) for r in steps]  # type: ignore[attr-defined]
    assert sum(z for z, _ in counts) == 3 and sum(s for _, s in counts) == 1, counts
