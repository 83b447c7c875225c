"""The learning task family: small real libraries with one typed bug, fast tests, a held-out split.

`rollstream tasks family --split train|heldout --n N --seed S --out DIR` writes N Harbor
tasks, deterministically from the seed. Each task's workspace is one library `lib.py`
(a module of `sandboxes.tasks.family_modules`, renamed afresh for each task by
`sandboxes.tasks.family_names`), its tests (`tests/test_lib.py`, data-driven cases) and
a test runner `run_tests.py` that prints each failing case with the line of `lib.py`
that produced the wrong value. The train and held-out splits draw from disjoint modules.

Every library holds the module's functions and four more, one per `BugKind`, each a copy
of a module function with that kind's injection on its line, so `lib.py` shows each
kind's telltale exactly once (`Library`, the same text whatever the task's kind). In a
task of kind `k` the `k` line is the bug (its tests expect the copy's original values)
and the other three are decoys: correct code whose tests expect what the line computes.
The fix is `k`'s one `sed` command; any other kind's `sed` rewrites its decoy and breaks
a passing test. So the skill a small model can learn here is the agent's: run the tests,
read which line is wrong and how, edit, submit. A fix guessed without reading the test
output succeeds one time in `len(KINDS)` (kinds are balanced, round robin), and applying
every fix never does.

Every task is checked before it is written (pure Python, `case_outcomes` judging as the
runner does): the bug fails a case, its kind's fix restores the original file exactly,
and every other set of fixes fails some case. A verifier run is one Python start (~30 ms).
"""

from __future__ import annotations

import itertools
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
FAMILY_VERSION = 5  # bump when generated tasks change, so kept task sets are rebuilt


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
class Library:
    """One task's library before its kind is chosen: `lib.py` reads the same whatever the kind.

    `functions` (file order, renamed) are the module's functions and four slots, one per kind:
    slot `k` shows `k`'s injection of a copy of a module function (`slots[k]`: its index), and
    `originals[k]` is that copy before the injection. The task of kind `k` expects `originals[k]`'s
    values from slot `k` (the bug) and the shown expressions' values from every other slot (decoys).
    """

    module: Module
    functions: tuple[Function, ...]
    slots: dict[str, int]
    originals: dict[str, Function]


Case = tuple[str, tuple[object, ...], object]  # (function name, arguments, expected result)


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
    cases: tuple[Case, ...]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    instruction: str


def _results(function: Function) -> list[object]:
    namespace: dict[str, object] = {}
    exec(f"def {function.name}({function.params}):\n    return {function.expr}\n", namespace)
    call = namespace[function.name]
    return [call(*args) for args in function.cases]  # type: ignore[operator]


def _failing(function: Function, kind: BugKind) -> list[int]:
    buggy = Function(function.name, function.params, kind.inject(function.expr), function.cases)
    return [i for i, (a, b) in enumerate(zip(_results(function), _results(buggy), strict=True)) if a != b]


def kind_sources(module: Module) -> dict[str, list[Function]]:
    """The module's functions each kind can be injected into (so that some case tells them apart)."""
    by_kind: dict[str, list[Function]] = {kind.name: [] for kind in KINDS}
    for function in module.functions:
        results = _results(function)
        for kind in KINDS:
            if kind.applies(function, results) and _failing(function, kind):
                by_kind[kind.name].append(function)
    missing = [name for name, functions in by_kind.items() if not functions]
    if missing:
        raise FamilyError(f"module {module.name!r} has no function a {', '.join(missing)} slot can copy")
    return by_kind


def build_library(
    module: Module, sources: dict[str, list[Function]], split: str, rng: random.Random
) -> Library:
    """The module's functions and one slot per kind, shuffled and renamed; draws nothing kind-specific."""
    copies = [rng.choice(sources[kind.name]) for kind in KINDS]
    entries = [*module.functions, *copies]
    order = list(range(len(entries)))
    rng.shuffle(order)
    named = renamed([entries[i] for i in order], split, rng)
    slots = {kind.name: order.index(len(module.functions) + k) for k, kind in enumerate(KINDS)}
    shown = list(named)
    for kind in KINDS:
        plain = named[slots[kind.name]]
        shown[slots[kind.name]] = Function(plain.name, plain.params, kind.inject(plain.expr), plain.cases)
    originals = {name: named[index] for name, index in slots.items()}
    return Library(module, tuple(shown), slots, originals)


def _lib_text(module: Module, functions: list[Function] | tuple[Function, ...]) -> str:
    parts = [f'"""{module.doc}"""\n']
    for function in functions:
        parts.append(f"\n\ndef {function.name}({function.params}):\n    return {function.expr}\n")
    return "".join(parts)


def _tests_text(cases: tuple[Case, ...]) -> str:
    lines = ['"""Cases: (function, arguments, expected result)."""\n', "\nCASES = [\n"]
    lines += [f"    ({name!r}, {args!r}, {expected!r}),\n" for name, args, expected in cases]
    return "".join([*lines, "]\n"])


def case_outcomes(lib: str, cases: tuple[Case, ...]) -> dict[str, bool]:
    """Test id -> passed, for `lib`'s source on `cases`, judged as `run_tests.py` judges them
    (a library that does not import fails every case; a case that raises fails)."""
    ids = _case_ids(cases)
    namespace: dict[str, object] = {}
    try:
        exec(compile(lib, LIB_FILE, "exec"), namespace)
    except Exception:  # the runner counts an unimportable lib.py as every case failed
        return dict.fromkeys(ids, False)
    outcomes = {}
    for test_id, (name, args, expected) in zip(ids, cases, strict=True):
        try:
            value = namespace[name](*args)  # type: ignore[operator]
        except Exception:
            outcomes[test_id] = False
            continue
        outcomes[test_id] = value == expected and type(value) is type(expected)
    return outcomes


def _case_ids(cases: tuple[Case, ...]) -> list[str]:
    counts: dict[str, int] = {}
    ids = []
    for name, _, _ in cases:
        counts[name] = counts.get(name, -1) + 1
        ids.append(f"{TESTS_FILE}::{name}[{counts[name]}]")
    return ids


def family_tasks(split: str, n: int, seed: int) -> list[FamilyTask]:
    """`n` tasks of `split`, the same for the same (split, n, seed); kinds in round robin, and each
    module in turn for one round of the kinds, so which library a task has says nothing of its kind."""
    if n < 1:
        raise FamilyError(f"--n must be at least 1, got {n}")
    if split not in SPLITS:
        raise FamilyError(f"unknown split {split!r}; use one of {', '.join(SPLITS)}")
    rng = random.Random(f"{split}:{seed}")
    modules = list(SPLITS[split])
    rng.shuffle(modules)
    sources = {module.name: kind_sources(module) for module in modules}
    first = rng.randrange(len(KINDS))
    tasks = []
    for index in range(n):
        kind = KINDS[(first + index) % len(KINDS)]
        module = modules[(index // len(KINDS)) % len(modules)]
        library = build_library(module, sources[module.name], split, rng)
        buggy = library.originals[kind.name].name
        tasks.append(make_task(f"{split}-{index:04d}-{module.name}-{buggy}", library, kind))
    return tasks


def make_task(task_id: str, library: Library, kind: BugKind) -> FamilyTask:
    """The task of `library` whose bug is `kind`'s slot; checked (`check_task`) before it is returned."""
    truth = list(library.functions)
    truth[library.slots[kind.name]] = library.originals[kind.name]
    cases = tuple(
        (function.name, args, value)
        for function in truth
        for args, value in zip(function.cases, _results(function), strict=True)
    )
    lib = _lib_text(library.module, library.functions)
    outcomes = case_outcomes(lib, cases)
    task = FamilyTask(
        id=task_id,
        module=library.module.name,
        function=library.originals[kind.name].name,
        kind=kind.name,
        lib=lib,
        fixed_lib=_lib_text(library.module, truth),
        tests=_tests_text(cases),
        cases=cases,
        fail_to_pass=tuple(test for test, passed in outcomes.items() if not passed),
        pass_to_pass=tuple(test for test, passed in outcomes.items() if passed),
        instruction=INSTRUCTION,
    )
    check_task(task)
    return task


def apply_fixes(kinds: tuple[BugKind, ...], text: str) -> str:
    for kind in kinds:
        text = apply_fix(kind, text)
    return text


def check_task(task: FamilyTask) -> None:
    """The bug fails a case; its kind's fix alone restores the library exactly; each line carries at
    most one kind's pattern (so fixes commute); and every other set of fixes fails some case: a fix
    of another kind breaks that kind's decoy, with or without the right fix beside it."""
    own = KIND_BY_NAME[task.kind]
    if not task.fail_to_pass:
        raise FamilyError(f"{task.id}: the {task.kind} bug fails no case")
    if apply_fix(own, task.lib) != task.fixed_lib or not all(
        case_outcomes(task.fixed_lib, task.cases).values()
    ):
        raise FamilyError(f"{task.id}: the {task.kind} fix does not restore the library")
    for line in task.lib.splitlines():
        if sum(bool(re.search(kind.fix_regex, line)) for kind in KINDS) > 1:
            raise FamilyError(f"{task.id}: the line {line.strip()!r} carries more than one kind's pattern")
    for size in range(1, len(KINDS) + 1):
        for fixes in itertools.combinations(KINDS, size):
            if fixes != (own,) and all(case_outcomes(apply_fixes(fixes, task.lib), task.cases).values()):
                names = ", ".join(kind.name for kind in fixes)
                raise FamilyError(f"{task.id}: the fixes {names} pass without reading the tests")


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
