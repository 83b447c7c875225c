"""The learning task family: small real libraries with one typed bug, fast tests, a held-out split.

`rollstream tasks family --split train|heldout --n N --seed S --out DIR` writes N Harbor
tasks, deterministically from the seed. Each task's workspace is one library `lib.py`
(a module of `sandboxes.tasks.family_modules`, its functions in a seeded order and renamed
afresh for each task by `sandboxes.tasks.family_names`), its
tests (`tests/test_lib.py`, data-driven cases) and a test runner `run_tests.py` that
prints each failing case with the line of `lib.py` that produced the wrong value. One
function carries one bug of a `BugKind`; the fix is that kind's one `sed` command, so
the skill a small model can learn here is the agent's: run the tests, read which line
is wrong and how, edit, submit. The train and held-out splits draw from disjoint
modules. Kinds are balanced (round robin), so guessing a fix without reading the test
output succeeds one time in `len(KINDS)`.

Every task is checked before it is written (pure Python, no sandbox): the bug fails at
least one case, and its kind's fix restores the original file exactly while every
other kind's fix changes nothing. A verifier run is one Python start (~30 ms).
"""

from __future__ import annotations

import json
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sandboxes.tasks.family_modules import SPLITS, Function, Module
from sandboxes.tasks.family_names import renamed
from sandboxes.tasks.family_runner import RUNNER_SOURCE, TEST_SH
from sandboxes.tasks.harbor import REPO_DIR, Task, TaskMetadata, write_task_files

LIB_FILE = "lib.py"
TESTS_FILE = "tests/test_lib.py"
RUN_TESTS = "python3 run_tests.py"
# The same words for every task: what differs between tasks is in the repository and its test output,
# so the first step (run the tests) is learned once for every library, held-out ones included.
# Nor do they hold a word a fix keys on ("not", "<", "min", "+ 1"): with "do not edit" here a small
# model saw "not" in every prompt, and its one sign of a negation line was "not" after "return".
INSTRUCTION = (
    "`lib.py` has a bug: some of its tests fail.\n\n"
    f"Run the tests with `{RUN_TESTS}`, fix the bug in `lib.py` (leave the tests as they are), and submit."
)
FAMILY_VERSION = 4  # bump when generated tasks change, so kept task sets are rebuilt


class FamilyError(ValueError):
    """A family request that cannot be built; the message says what to change."""


@dataclass(frozen=True)
class BugKind:
    """A typed bug: where it applies, how it is injected into an expression, and its fix."""

    name: str
    applies: Callable[[Function, list[object]], bool]  # (function, its original results)
    inject: Callable[[str], str]
    fix_pattern: str  # sed `s` expression, as a Python regex and replacement below
    fix_regex: str
    fix_replacement: str
    telltale: Callable[[str], bool]  # on the stripped source line the test output shows

    @property
    def fix_command(self) -> str:
        return f"sed -i '{self.fix_pattern}' {LIB_FILE}"


def _numeric(results: list[object]) -> bool:
    return all(isinstance(r, int) and not isinstance(r, bool) for r in results)


def _boolean(results: list[object]) -> bool:
    return all(isinstance(r, bool) for r in results)


KINDS: tuple[BugKind, ...] = (
    BugKind(
        "off_by_one",
        lambda f, r: _numeric(r),
        lambda e: f"{e} + 1",
        "s/ + 1$//",
        r" \+ 1$",
        "",
        lambda line: line.endswith(" + 1"),
    ),
    BugKind(
        "comparison",
        lambda f, r: f.expr.count(" <= ") == 1,
        lambda e: e.replace(" <= ", " < "),
        "s/ < / <= /",
        r" < ",
        " <= ",
        lambda line: " < " in line,
    ),
    BugKind(
        "negation",
        lambda f, r: _boolean(r),
        lambda e: f"not {e}",
        "s/return not /return /",
        r"return not ",
        "return ",
        lambda line: "return not " in line,
    ),
    BugKind(
        "min_max",
        lambda f, r: f.expr.count("max(") == 1,
        lambda e: e.replace("max(", "min("),
        "s/min(/max(/",
        r"min\(",
        "max(",
        lambda line: "min(" in line,
    ),
)
KIND_BY_NAME = {kind.name: kind for kind in KINDS}


def kind_of_line(line: str) -> BugKind | None:
    """The bug kind whose telltale the shown source line carries (None: none does)."""
    stripped = line.strip()
    return next((kind for kind in KINDS if kind.telltale(stripped)), None)


def apply_fix(kind: BugKind, text: str) -> str:
    """What `kind.fix_command` (sed, first match on each line) does to `text`."""
    return "".join(
        re.sub(kind.fix_regex, kind.fix_replacement.replace("\\", "\\\\"), line, count=1)
        for line in text.splitlines(keepends=True)
    )


@dataclass(frozen=True)
class FamilyTask:
    """One task's content, before it is written."""

    id: str
    module: str
    function: str
    kind: str
    lib: str
    fixed_lib: str
    tests: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    instruction: str


def _results(function: Function) -> list[object]:
    namespace: dict[str, object] = {}
    exec(f"def {function.name}({function.params}):\n    return {function.expr}\n", namespace)
    call = namespace[function.name]
    return [call(*args) for args in function.cases]  # type: ignore[operator]


def _lib_text(module: Module, functions: list[Function], buggy: str, kind: BugKind | None) -> str:
    parts = [f'"""{module.doc}"""\n']
    for function in functions:
        expr = kind.inject(function.expr) if kind and function.name == buggy else function.expr
        parts.append(f"\n\ndef {function.name}({function.params}):\n    return {expr}\n")
    return "".join(parts)


def _tests_text(functions: list[Function]) -> tuple[str, list[tuple[str, Function, int]]]:
    lines = ['"""Cases: (function, arguments, expected result)."""\n', "\nCASES = [\n"]
    ids = []
    for function in functions:
        for index, (args, expected) in enumerate(zip(function.cases, _results(function), strict=True)):
            lines.append(f"    ({function.name!r}, {args!r}, {expected!r}),\n")
            ids.append((f"{TESTS_FILE}::{function.name}[{index}]", function, index))
    lines.append("]\n")
    return "".join(lines), ids


def _failing(function: Function, kind: BugKind) -> list[int]:
    buggy = Function(function.name, function.params, kind.inject(function.expr), function.cases)
    return [i for i, (a, b) in enumerate(zip(_results(function), _results(buggy), strict=True)) if a != b]


def candidates(split: str) -> dict[str, list[tuple[Module, Function]]]:
    """(module, function) pairs each kind can be injected into, for one split."""
    if split not in SPLITS:
        raise FamilyError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    by_kind: dict[str, list[tuple[Module, Function]]] = {kind.name: [] for kind in KINDS}
    for module in SPLITS[split]:
        for function in module.functions:
            results = _results(function)
            for kind in KINDS:
                if kind.applies(function, results) and _failing(function, kind):
                    by_kind[kind.name].append((module, function))
    return by_kind


def family_tasks(split: str, n: int, seed: int) -> list[FamilyTask]:
    """`n` tasks of `split`, the same for the same (split, n, seed); kinds in round robin."""
    if n < 1:
        raise FamilyError(f"--n must be at least 1, got {n}")
    rng = random.Random(f"{split}:{seed}")
    pools = candidates(split)
    for kind in KINDS:
        rng.shuffle(pools[kind.name])
    first = rng.randrange(len(KINDS))
    tasks = []
    for index in range(n):
        kind = KINDS[(first + index) % len(KINDS)]
        pool = pools[kind.name]
        module, function = pool[(index // len(KINDS)) % len(pool)]
        order = list(module.functions)
        rng.shuffle(order)
        named = renamed(order, split, rng)
        buggy = named[order.index(function)]
        tasks.append(_task(f"{split}-{index:04d}-{module.name}-{buggy.name}", module, named, buggy, kind))
    return tasks


def _task(task_id: str, module: Module, order: list[Function], buggy: Function, kind: BugKind) -> FamilyTask:
    lib = _lib_text(module, order, buggy.name, kind)
    fixed = _lib_text(module, order, buggy.name, None)
    tests, ids = _tests_text(order)
    failing = set(_failing(buggy, kind))
    fail_to_pass = tuple(i for i, f, n in ids if f is buggy and n in failing)
    pass_to_pass = tuple(i for i, f, n in ids if not (f is buggy and n in failing))
    task = FamilyTask(
        id=task_id,
        module=module.name,
        function=buggy.name,
        kind=kind.name,
        lib=lib,
        fixed_lib=fixed,
        tests=tests,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        instruction=INSTRUCTION,
    )
    check_task(task)
    return task


def check_task(task: FamilyTask) -> None:
    """The bug fails a case; its fix restores the library; every other kind's fix is a no-op."""
    if not task.fail_to_pass:
        raise FamilyError(f"{task.id}: the {task.kind} bug fails no case")
    for kind in KINDS:
        after = apply_fix(kind, task.lib)
        expected = task.fixed_lib if kind.name == task.kind else task.lib
        if after != expected:
            raise FamilyError(f"{task.id}: the {kind.name} fix does not do what it should on this library")


def write_family(
    out: Path,
    split: str,
    n: int,
    seed: int,
    *,
    python: str = "python3",
    verifier_timeout_s: float = 30.0,
    agent_timeout_s: float = 300.0,
) -> list[Task]:
    """Write the tasks under `out` (one directory each, replacing old ones) and a `family.json`."""
    written = []
    out.mkdir(parents=True, exist_ok=True)
    for item in family_tasks(split, n, seed):
        written.append(_write_task(out / item.id, item, python, verifier_timeout_s, agent_timeout_s))
    kinds = [k.name for k in KINDS]
    recipe = {"split": split, "n": n, "seed": seed, "version": FAMILY_VERSION, "kinds": kinds}
    (out / "family.json").write_text(json.dumps(recipe, indent=2) + "\n")
    return written


def _write_task(task_dir: Path, item: FamilyTask, python: str, verifier_s: float, agent_s: float) -> Task:
    if task_dir.exists():
        shutil.rmtree(task_dir)
    repo = task_dir / REPO_DIR
    (repo / "tests").mkdir(parents=True)
    (repo / LIB_FILE).write_text(item.lib)
    (repo / TESTS_FILE).write_text(item.tests)
    (repo / "run_tests.py").write_text(RUNNER_SOURCE)
    suite = task_dir / "tests"
    suite.mkdir(parents=True)
    (suite / "test_lib.py").write_text(item.tests)
    (suite / "run_tests.py").write_text(RUNNER_SOURCE)
    ids = {"fail_to_pass": list(item.fail_to_pass), "pass_to_pass": list(item.pass_to_pass)}
    (suite / "ids.json").write_text(json.dumps(ids, indent=1) + "\n")
    task = Task(
        id=item.id,
        dir=task_dir,
        instruction=item.instruction,
        workspace=repo,
        metadata=TaskMetadata(
            fail_to_pass=item.fail_to_pass,
            pass_to_pass=item.pass_to_pass,
            source=f"family:{item.module}",
            difficulty="easy",
            tags=("family", item.module, item.kind),
            mutation=f"{item.kind} in {LIB_FILE}:{item.function}",
        ),
        verifier_timeout_s=verifier_s,
        agent_timeout_s=agent_s,
    )
    fix = KIND_BY_NAME[item.kind].fix_command
    solve = f'#!/usr/bin/env bash\nset -euo pipefail\ncd "${{REPO_DIR:-$PWD}}"\n{fix}\n'
    write_task_files(task_dir, task, test_sh=TEST_SH.format(python=python), solve_sh=solve)
    return task
