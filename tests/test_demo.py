"""The main job end to end: `rollstream demo` on the real broker, sandboxes, engine and SQLite."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from sqlalchemy import create_engine, text


def test_demo_runs_the_whole_pipeline(kafka_bootstrap: str, default_tasks_dir: Path, tmp_path: Path) -> None:
    run = f"demo-test-{uuid.uuid4().hex[:6]}"
    state = tmp_path / ".rollstream"
    command = [
        sys.executable, "-m", "rollstream", "demo", "--tasks", "2", "--group-size", "2", "--timeout", "420",
        "--set", f'run.name="{run}"',
        "--set", f'run.state_dir="{state}"',
        "--set", f'topics.prefix="t-{uuid.uuid4().hex[:8]}-"',
        "--set", f'kafka.bootstrap="{kafka_bootstrap}"',
        "--set", f'tasks.root="{default_tasks_dir}"',
        "--set", "policy.max_turns=3",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    logs = "\n".join(p.read_text()[-1500:] for p in (state / "runs" / run / "logs").glob("*.log"))
    assert result.returncode == 0, f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}\n{logs}"

    report = state / "runs" / run / "report"
    assert (report / "index.html").exists() and (report / "timeline.png").exists()
    engine = create_engine(f"sqlite:///{state / 'events.db'}")
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT outcome, reward, turns FROM trajectories WHERE run_id = :r AND outcome IS NOT NULL"),
            {"r": run},
        ).all()
        types = {t for (t,) in connection.execute(
            text("SELECT DISTINCT type FROM events WHERE run_id = :r"), {"r": run})}  # fmt: skip
    engine.dispose()
    scored = [r for r in rows if not r.outcome.startswith("infra_error")]
    assert len(scored) == 4, rows  # 2 tasks x 2 attempts, every one finished and scored
    assert all(r.turns <= 3 for r in scored)  # the --set override reached the rollout worker
    assert {"trajectory.started", "turn.generated", "tests.ran", "trajectory.finished"} <= types
    assert "group.formed" in types  # the stream worker formed (or dropped) both groups, sunk to SQL
