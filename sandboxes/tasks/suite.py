"""Runs a project's pytest suite inside one long-lived sandbox (used by the task builder).

The sandbox works on a copy of the unpacked sdist; the builder swaps one library file
for its mutant, runs the tests that cover it, and puts the original back. pytest comes
from the zipped runtime (`runtime.ensure_pytest_zip`), uploaded once per sandbox.
Only the `-r` summary lines travel back, so large suites stay under the output limit.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path

from sandboxes.base import Sandbox, SandboxFactory, SandboxStartError
from sandboxes.tasks.mutants import SuiteRun
from sandboxes.tasks.runtime import COVER_PLUGIN, NO_ASLR, PYTEST_FLAGS, parse_summary

SCRATCH = ".rollstream-build"
MAX_ARGS_CHARS = 60_000  # stay well under Linux's 128 KiB limit on one argument
LOG_TAIL_LINES = 25


class SuiteRunner:
    """One started sandbox over the project, able to run tests and swap files."""

    def __init__(
        self, factory: SandboxFactory, project: Path, pyz: Path, source_roots: tuple[str, ...], python: str
    ) -> None:
        self._box: Sandbox = factory.create(project)
        self._pyz = pyz
        self._source_roots = source_roots
        self._python = python
        self._root = ""

    async def start(self) -> None:
        await self._box.start()
        result = await self._box.exec(f"mkdir -p {SCRATCH} && pwd", timeout=60)
        if not result.ok:
            raise SandboxStartError(f"cannot prepare the build sandbox: {result.stderr.strip()}")
        self._root = result.stdout.strip().splitlines()[-1]
        await self._box.upload(self._pyz, f"{self._root}/{SCRATCH}/pytest.pyz")

    async def stop(self) -> None:
        await self._box.stop()

    def _env(self) -> dict[str, str]:
        paths = [f"{self._root}/{r}".rstrip("/.") if r != "." else self._root for r in self._source_roots]
        return {
            "PYTHONPATH": ":".join([*paths, f"{self._root}/{SCRATCH}/pytest.pyz"]),
            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "PYTHONHASHSEED": "0",
            "COLUMNS": "400",
        }

    async def run(
        self, targets: list[str], timeout: float, *, coverage: bool = False
    ) -> tuple[SuiteRun, str]:
        """Run pytest on `targets` (node ids or paths): the parsed summary and the log's tail."""
        args = " ".join(shlex.quote(t) for t in targets)
        if len(args) > MAX_ARGS_CHARS:
            args = " ".join(shlex.quote(t) for t in sorted({t.split("::")[0] for t in targets}))
        cover = f"-p {COVER_PLUGIN} --rollstream-cover={SCRATCH}/cover.json" if coverage else ""
        log = f"{SCRATCH}/pytest.log"
        command = (
            f"{NO_ASLR}$NOASLR {self._python} -m pytest {PYTEST_FLAGS} {cover} {args} > {log} 2>&1; "
            f"grep -E '^(PASSED|FAILED|ERROR|XFAIL|XPASS) ' {log}; "
            f"echo '--- tail'; tail -n {LOG_TAIL_LINES} {log}"
        )
        result = await self._box.exec(command, timeout=timeout, env=self._env())
        summary, _, tail = result.stdout.partition("--- tail")
        return SuiteRun(parse_summary(summary), timed_out=result.timed_out), tail.strip()

    async def coverage(self) -> dict:
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / "cover.json"
            await self._box.download(f"{self._root}/{SCRATCH}/cover.json", local)
            return json.loads(local.read_text())

    async def write_file(self, relative: str, text: str) -> None:
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / Path(relative).name
            local.write_text(text)
            await self._box.upload(local, f"{self._root}/{relative}")
