"""Which mutants to try, in what order, and which to keep (pure functions, no sandbox).

- `Coverage` maps each function (file, first line) to the baseline-passing tests that ran
  it; functions that ran outside any test (at import or collection time) are never
  mutated, since a bug there breaks the whole suite rather than a few tests.
- `order_candidates` drops uncovered mutations and interleaves functions in a seeded
  shuffle (one mutation per function before a second one), so a build is deterministic
  for a seed and its tasks are spread over the library.
- `judge` applies the keep rule: at least one test goes from pass to fail, none of the
  tests run errs in a way that hides its outcome, and not too many fail.
- `Deduper` removes duplicates: the same program (normalized AST), the same failing set
  in the same function, and more than `max_per_function` tasks from one function.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from sandboxes.tasks.mutators import Mutation

FunctionKey = tuple[str, int]  # (path relative to the repo, first line of the code object)


@dataclass(frozen=True)
class Coverage:
    tests_by_function: dict[FunctionKey, frozenset[str]]
    import_time: frozenset[FunctionKey]

    @classmethod
    def from_plugin(cls, data: dict[str, Any], passing: frozenset[str]) -> Coverage:
        """Read the coverage plugin's JSON, keeping only tests that passed at baseline."""
        functions = [(str(path), int(line)) for path, line in data["functions"]]
        by_function: dict[FunctionKey, set[str]] = defaultdict(set)
        for test, indexes in data["tests"].items():
            if test in passing:
                for index in indexes:
                    by_function[functions[index]].add(test)
        outside = frozenset(functions[i] for i in data["outside"])
        return cls({k: frozenset(v) for k, v in by_function.items()}, outside)

    def tests_for(self, mutation: Mutation) -> frozenset[str]:
        key = (mutation.path, mutation.function_line)
        if key in self.import_time:
            return frozenset()
        return self.tests_by_function.get(key, frozenset())


def order_candidates(mutations: list[Mutation], coverage: Coverage, seed: int) -> list[Mutation]:
    """Covered mutations in a seeded order that visits every function before revisiting one."""
    rng = random.Random(seed)
    by_function: dict[FunctionKey, list[Mutation]] = defaultdict(list)
    for mutation in mutations:
        if coverage.tests_for(mutation):
            by_function[(mutation.path, mutation.function_line)].append(mutation)
    keys = sorted(by_function)
    rng.shuffle(keys)
    for key in keys:
        rng.shuffle(by_function[key])
    ordered: list[Mutation] = []
    depth = 0
    while len(ordered) < sum(len(v) for v in by_function.values()):
        ordered += [by_function[k][depth] for k in keys if depth < len(by_function[k])]
        depth += 1
    return ordered


@dataclass(frozen=True)
class SuiteRun:
    """One pytest run of a mutant: node id -> (outcome, message), and whether it timed out."""

    outcomes: dict[str, tuple[str, str]]
    timed_out: bool = False


@dataclass(frozen=True)
class Judgement:
    kept: bool
    reason: str  # "kept" or why not
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    messages: dict[str, str] = field(default_factory=dict)


def judge(run: SuiteRun, expected_passing: frozenset[str], max_fail_to_pass: int) -> Judgement:
    """Keep a mutant when ≥1 of the tests that passed at baseline now fails and the rest pass."""
    if run.timed_out:
        return Judgement(False, "timeout")
    if not run.outcomes:
        return Judgement(False, "no_test_results")
    failing = sorted(t for t in expected_passing if run.outcomes.get(t, ("MISSING", ""))[0] != "PASSED")
    if not failing:
        return Judgement(False, "no_test_fails")
    if len(failing) > max_fail_to_pass:
        return Judgement(False, "too_many_failures")
    if any(run.outcomes.get(t, ("MISSING", ""))[0] == "MISSING" for t in failing):
        return Judgement(False, "tests_not_run")  # a collection error hides what failed
    passing = tuple(sorted(expected_passing - set(failing)))
    messages = {t: run.outcomes[t][1] for t in failing}
    return Judgement(True, "kept", tuple(failing), passing, messages)


class Deduper:
    """Admits a kept mutant unless it duplicates one admitted before (see module docstring)."""

    def __init__(self, max_per_function: int) -> None:
        self.max_per_function = max_per_function
        self._programs: set[str] = set()
        self._failures: set[tuple[FunctionKey, frozenset[str]]] = set()
        self._per_function: dict[FunctionKey, int] = defaultdict(int)

    def check(self, mutation: Mutation, program: str, failing: tuple[str, ...]) -> str | None:
        """None when admissible, else the reason it is a duplicate (nothing is recorded)."""
        function = (mutation.path, mutation.function_line)
        if program in self._programs:
            return "duplicate_program"
        if (function, frozenset(failing)) in self._failures:
            return "duplicate_failures"
        if self._per_function[function] >= self.max_per_function:
            return "function_quota"
        return None

    def admit(self, mutation: Mutation, program: str, failing: tuple[str, ...]) -> None:
        function = (mutation.path, mutation.function_line)
        self._programs.add(program)
        self._failures.add((function, frozenset(failing)))
        self._per_function[function] += 1
