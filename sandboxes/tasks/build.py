"""`tasks build --from-sdist`: turn a pure-Python library from PyPI into Harbor tasks.

Pipeline: fetch + unpack the sdist → run its suite once in a sandbox with per-test
coverage → list AST mutations of covered functions in a seeded order → test each mutant
(only the tests covering its function, `build_concurrency` sandboxes at once) → confirm
a kept one against every baseline-passing test → dedupe → write the task.

Deterministic for a seed: candidates are tried in windows and committed in candidate
order, so which sandbox finished first never changes the result. Libraries that do not
fit raise `UnfitLibraryError` with the reason (no sdist, no tests, compiled extension,
tests not pytest-runnable, suite fails unmutated, nothing covered).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

from sandboxes.base import SandboxFactory
from sandboxes.settings import TaskSettings
from sandboxes.tasks.mutants import Coverage, Deduper, Judgement, SuiteRun, judge, order_candidates
from sandboxes.tasks.mutators import Mutation, MutationError, apply_mutation, find_mutations, normalized_ast
from sandboxes.tasks.runtime import ensure_pytest_zip
from sandboxes.tasks.sdist import (
    ProjectLayout,
    SdistSpec,
    UnfitLibraryError,
    analyze_project,
    fetch_sdist,
    unpack_sdist,
)
from sandboxes.tasks.suite import SuiteRunner
from sandboxes.tasks.writer import KeptMutant, write_sdist_task

ProgressFn = Callable[[str, int, int], None]  # (what, done, total)


@dataclass(frozen=True)
class BuildRequest:
    spec: SdistSpec
    out: Path
    max_tasks: int
    seed: int = 0


@dataclass
class BuildReport:
    spec: str
    task_ids: list[str] = field(default_factory=list)
    baseline_passed: int = 0
    baseline_failed: int = 0
    candidates: int = 0
    tried: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    duration_s: float = 0.0


@dataclass(frozen=True)
class _Outcome:
    mutation: Mutation
    mutated: str
    judgement: Judgement


class _Context:
    """What every mutant evaluation needs: the project, its baseline and the runners."""

    def __init__(
        self,
        layout: ProjectLayout,
        sources: dict[str, str],
        coverage: Coverage,
        passing: frozenset[str],
        runners: asyncio.Queue[SuiteRunner],
        settings: TaskSettings,
    ) -> None:
        self.layout, self.sources, self.coverage = layout, sources, coverage
        self.passing, self.runners, self.settings = passing, runners, settings

    async def evaluate(self, mutation: Mutation) -> _Outcome:
        original = self.sources[mutation.path]
        try:
            mutated = apply_mutation(original, mutation)
        except MutationError:
            return _Outcome(mutation, "", Judgement(False, "invalid_mutant"))
        runner = await self.runners.get()
        try:
            await runner.write_file(mutation.path, mutated)
            try:
                covering = self.coverage.tests_for(mutation)
                run, _ = await runner.run(sorted(covering), self.settings.mutant_timeout_s)
                verdict = judge(run, covering, self.settings.max_fail_to_pass)
                if verdict.kept:  # confirm against every test that passed at baseline
                    full, _ = await runner.run(
                        list(self.layout.test_targets()), self.settings.suite_timeout_s
                    )
                    verdict = judge(full, self.passing, self.settings.max_fail_to_pass)
            finally:
                await runner.write_file(mutation.path, original)
        finally:
            self.runners.put_nowait(runner)
        return _Outcome(mutation, mutated, verdict)


async def build_from_sdist(
    request: BuildRequest,
    settings: TaskSettings,
    factory: SandboxFactory,
    cache_dir: Path,
    progress: ProgressFn | None = None,
) -> BuildReport:
    """Build up to `request.max_tasks` tasks into `request.out`; raises UnfitLibraryError."""
    began = time.monotonic()
    report = BuildReport(spec=str(request.spec))
    notify = progress or (lambda what, done, total: None)
    notify(f"{request.spec}: download", 0, 1)
    archive = await asyncio.to_thread(
        fetch_sdist,
        request.spec,
        cache_dir / "sdists",
        index_url=settings.pypi_url,
        timeout_s=settings.download_timeout_s,
    )
    pyz = await asyncio.to_thread(ensure_pytest_zip, cache_dir / "runtime")
    with tempfile.TemporaryDirectory(prefix="rollstream-build-") as scratch:
        root = await asyncio.to_thread(unpack_sdist, archive, Path(scratch) / "project")
        layout = analyze_project(root, request.spec)
        async with _runners(factory, layout, pyz, settings) as runners:
            context = await _baseline(request.spec, layout, runners, settings, report, notify)
            kept = await _search(request, context, report, notify)
        request.out.mkdir(parents=True, exist_ok=True)
        for index, item in enumerate(kept):
            task_id = f"{request.spec.slug}-{index:03d}-{item.mutation.kind.replace('_', '-')}"
            await asyncio.to_thread(
                write_sdist_task, request.out / task_id, item, layout, pyz, request.spec, settings
            )
            report.task_ids.append(task_id)
    report.duration_s = time.monotonic() - began
    return report


@contextlib.asynccontextmanager
async def _runners(
    factory: SandboxFactory, layout: ProjectLayout, pyz: Path, settings: TaskSettings
) -> AsyncIterator[asyncio.Queue[SuiteRunner]]:
    started: list[SuiteRunner] = []
    queue: asyncio.Queue[SuiteRunner] = asyncio.Queue()
    try:
        for _ in range(max(1, settings.build_concurrency)):
            runner = SuiteRunner(factory, layout.root, pyz, layout.source_roots, settings.python)
            started.append(runner)
            await runner.start()
            queue.put_nowait(runner)
        yield queue
    finally:
        for runner in started:
            with contextlib.suppress(Exception):
                await runner.stop()


async def _baseline(
    spec: SdistSpec,
    layout: ProjectLayout,
    runners: asyncio.Queue[SuiteRunner],
    settings: TaskSettings,
    report: BuildReport,
    notify: ProgressFn,
) -> _Context:
    """Run the suite with coverage, then plain: tests passing in both (under the same id) count.

    Some suites' test ids are not stable (parameters from a set ordered by object addresses);
    a second run drops those, so FAIL_TO_PASS / PASS_TO_PASS only name tests that exist."""
    notify(f"{spec}: run the test suite", 0, 1)
    runner = await runners.get()
    try:
        covered, tail = await runner.run(list(layout.test_targets()), settings.suite_timeout_s, coverage=True)
        _check_baseline(spec, covered, tail, settings)
        cover_data = await runner.coverage()
        plain, tail = await runner.run(list(layout.test_targets()), settings.suite_timeout_s)
        _check_baseline(spec, plain, tail, settings)
    finally:
        runners.put_nowait(runner)
    passing = _passed(covered) & _passed(plain)
    report.baseline_passed = len(passing)
    report.baseline_failed = sum(
        1 for outcome, _ in plain.outcomes.values() if outcome in ("FAILED", "ERROR")
    )
    if not passing:
        raise UnfitLibraryError(f"{spec}: the suite fails unmutated (0 of {len(plain.outcomes)} tests pass)")
    sources = {path: (layout.root / path).read_text() for path in layout.source_files()}
    return _Context(layout, sources, Coverage.from_plugin(cover_data, passing), passing, runners, settings)


def _check_baseline(spec: SdistSpec, run: SuiteRun, tail: str, settings: TaskSettings) -> None:
    if run.timed_out:
        raise UnfitLibraryError(f"{spec}: the test suite did not finish in {settings.suite_timeout_s:.0f}s")
    if not run.outcomes:
        raise UnfitLibraryError(f"{spec}: tests are not pytest-runnable here; pytest said:\n{tail}")


def _passed(run: SuiteRun) -> frozenset[str]:
    return frozenset(test for test, (outcome, _) in run.outcomes.items() if outcome == "PASSED")


async def _search(
    request: BuildRequest, context: _Context, report: BuildReport, notify: ProgressFn
) -> list[KeptMutant]:
    mutations: list[Mutation] = []
    for path, text in context.sources.items():
        with contextlib.suppress(SyntaxError):
            mutations += find_mutations(text, path)
    candidates = order_candidates(mutations, context.coverage, request.seed)
    report.candidates = len(candidates)
    if not candidates:
        raise UnfitLibraryError(f"{request.spec}: no function is covered by a passing test")
    settings = context.settings
    deduper = Deduper(settings.max_per_function)
    kept: list[KeptMutant] = []
    window = max(1, settings.build_concurrency) * 2
    position = 0
    while (
        len(kept) < request.max_tasks
        and position < len(candidates)
        and report.tried < settings.max_mutants_tried
    ):
        batch: list[Mutation] = []
        while len(batch) < window and position < len(candidates):
            mutation = candidates[position]
            position += 1
            if deduper.check(mutation, "", ()) != "function_quota":
                batch.append(mutation)
        report.tried += len(batch)
        outcomes = await asyncio.gather(*(context.evaluate(m) for m in batch))
        for outcome in outcomes:  # committed in candidate order: deterministic
            _commit(outcome, deduper, kept, report, request.max_tasks)
        notify(f"{request.spec}: mutants", len(kept), request.max_tasks)
    return kept


def _commit(
    outcome: _Outcome, deduper: Deduper, kept: list[KeptMutant], report: BuildReport, limit: int
) -> None:
    if len(kept) >= limit:
        return
    verdict = outcome.judgement
    if not verdict.kept:
        report.rejected[verdict.reason] += 1
        return
    program = normalized_ast(outcome.mutated)
    duplicate = deduper.check(outcome.mutation, program, verdict.fail_to_pass)
    if duplicate:
        report.rejected[duplicate] += 1
        return
    deduper.admit(outcome.mutation, program, verdict.fail_to_pass)
    kept.append(KeptMutant(outcome.mutation, outcome.mutated, verdict))
