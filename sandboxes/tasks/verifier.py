"""The verifier: run a task's `tests/test.sh` in a sandbox and read the reward it writes.

Harbor's convention: the task's `tests/` is placed at `/tests`, `bash /tests/test.sh` runs
from the workspace, and the reward lands in `/logs/verifier/reward.txt` (a number) or
`reward.json` (`{"reward": x}`). Where `/tests` cannot be created (the bwrap sandbox has a
read-only root), both live under `/tmp/rollstream-verifier/`; test.sh reads their places
from `TESTS_DIR` and `LOGS_DIR`. Old logs are removed first, so an agent cannot plant one.

A test.sh that crashes, times out or leaves no readable reward raises `VerifierError`
(infrastructure, outcome `infra_error:verifier`), never a reward of 0. Per-test outcomes
come from `results.json` (written by our grade.py); a task without one gets empty dicts.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sandboxes.base import Sandbox, VerifierError
from sandboxes.tasks.harbor import Task

HARBOR_TESTS = "/tests"
HARBOR_LOGS = "/logs/verifier"
FALLBACK_ROOT = "/tmp/rollstream-verifier"
UPLOAD_NAME = ".rollstream-verifier-tests.tar"  # placed in the workspace: uploads elsewhere may be refused
SETUP_TIMEOUT_S = 60.0
ERROR_TAIL_CHARS = 2000


@dataclass(frozen=True)
class Verdict:
    reward: float
    fail_to_pass: dict[str, bool] = field(default_factory=dict)
    pass_to_pass: dict[str, bool] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def resolved(self) -> bool:
        return self.reward >= 1.0


@dataclass(frozen=True)
class _Dirs:
    tests: str
    logs: str


async def run_verifier(box: Sandbox, task: Task, timeout: float | None = None) -> Verdict:
    """Run `task`'s verifier in the started sandbox `box` (after the agent has finished)."""
    began = time.monotonic()
    limit = task.verifier_timeout_s if timeout is None else timeout
    dirs = await _prepare(box, task)
    env = {**task.verifier_env, "TESTS_DIR": dirs.tests, "LOGS_DIR": dirs.logs}
    result = await box.exec(f"bash {shlex.quote(dirs.tests)}/test.sh", timeout=limit, env=env)
    if result.timed_out:
        raise VerifierError(f"task {task.id}: test.sh timed out after {limit:.0f}s", backend=box.backend)
    reward = await _read_reward(box, task, dirs, _tail(result.stdout + result.stderr))
    results = await _read_results(box, dirs)
    return Verdict(
        reward=reward,
        fail_to_pass=results.get("fail_to_pass", {}),
        pass_to_pass=results.get("pass_to_pass", {}),
        duration_s=time.monotonic() - began,
    )


async def _prepare(box: Sandbox, task: Task) -> _Dirs:
    """Empty tests and logs directories in the sandbox, with the task's tests/ unpacked."""
    both = f"{HARBOR_TESTS} {HARBOR_LOGS}"
    harbor = f"mkdir -p {both} 2>/dev/null && test -w {HARBOR_TESTS} -a -w {HARBOR_LOGS}"
    probe = await box.exec(f"{harbor} && echo harbor || echo fallback", timeout=SETUP_TIMEOUT_S)
    if "harbor" in probe.stdout:
        dirs = _Dirs(HARBOR_TESTS, HARBOR_LOGS)
    else:
        dirs = _Dirs(f"{FALLBACK_ROOT}/tests", f"{FALLBACK_ROOT}/logs")
    upload = f"{await workspace_root(box)}/{UPLOAD_NAME}"
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "tests.tar"
        archive.write_bytes(_tar_directory(task.tests_dir))
        await box.upload(archive, upload)
    tests, logs, upload = shlex.quote(dirs.tests), shlex.quote(dirs.logs), shlex.quote(upload)
    setup = (
        f"rm -rf {tests}/* {logs}/* 2>/dev/null; mkdir -p {tests} {logs} && "
        f"tar -xf {upload} -C {tests}; status=$?; rm -f {upload}; exit $status"
    )
    result = await box.exec(setup, timeout=SETUP_TIMEOUT_S)
    if not result.ok:
        raise VerifierError(
            f"task {task.id}: cannot place tests/ in the sandbox: {_tail(result.stderr)}", backend=box.backend
        )
    return dirs


async def workspace_root(box: Sandbox) -> str:
    """The absolute path of the workspace inside the sandbox (commands start there)."""
    result = await box.exec("pwd", timeout=SETUP_TIMEOUT_S)
    if not result.ok or not result.stdout.strip():
        raise VerifierError(f"cannot find the workspace in sandbox {box.id}: {result.stderr.strip()}")
    return result.stdout.strip().splitlines()[-1]


def _tar_directory(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(directory.rglob("*")):
            archive.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    return buffer.getvalue()


async def _read_reward(box: Sandbox, task: Task, dirs: _Dirs, output: str) -> float:
    logs = shlex.quote(dirs.logs)
    text = await box.exec(
        f"cat {logs}/reward.txt 2>/dev/null || cat {logs}/reward.json", timeout=SETUP_TIMEOUT_S
    )
    if not text.ok or not text.stdout.strip():
        raise VerifierError(
            f"task {task.id}: test.sh wrote no reward.txt or reward.json; its output: {output or '(none)'}",
            backend=box.backend,
        )
    return parse_reward(text.stdout, task.id)


def parse_reward(text: str, task_id: str = "") -> float:
    """A reward.txt number or a reward.json object with a numeric "reward"; else VerifierError."""
    text = text.strip()
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise VerifierError(f"task {task_id}: unreadable reward {text[:200]!r}") from None
    if isinstance(value, dict):
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise VerifierError(f"task {task_id}: reward is not a number: {text[:200]!r}")
    return float(value)


async def _read_results(box: Sandbox, dirs: _Dirs) -> dict[str, dict[str, bool]]:
    result = await box.exec(f"cat {shlex.quote(dirs.logs)}/results.json 2>/dev/null", timeout=SETUP_TIMEOUT_S)
    if not result.ok:
        return {}
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError:
        return {}
    return {
        group: {str(k): bool(v) for k, v in data.get(group, {}).items()}
        for group in ("fail_to_pass", "pass_to_pass")
        if isinstance(data.get(group), dict)
    }


def _tail(text: str) -> str:
    text = text.strip()
    return text if len(text) <= ERROR_TAIL_CHARS else "..." + text[-ERROR_TAIL_CHARS:]
