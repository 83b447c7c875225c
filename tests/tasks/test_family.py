"""The learning task family: deterministic, balanced, disjoint splits, valid in real sandboxes;
the scripted expert reads the real runner's output."""

from __future__ import annotations

import asyncio
import random
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from agents.expert import RUN_REPLY, expert_reply, fix_reply
from agents.scaffold import instance_prompt, system_prompt
from agents.settings import ExpertSettings
from sandboxes.backends import make_factory
from sandboxes.settings import SandboxSettings
from sandboxes.tasks.check import check_tasks
from sandboxes.tasks.family import (
    INSTRUCTION,
    KIND_BY_NAME,
    KINDS,
    FamilyError,
    apply_fix,
    build_library,
    case_outcomes,
    family_tasks,
    kind_of_line,
    kind_sources,
    make_task,
    write_family,
)
from sandboxes.tasks.family_modules import SPLITS

SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def test_same_seed_same_tasks_other_seed_other_tasks() -> None:
    first, again = family_tasks("train", 24, 3), family_tasks("train", 24, 3)
    assert [(t.id, t.lib, t.tests) for t in first] == [(t.id, t.lib, t.tests) for t in again]
    other = family_tasks("train", 24, 4)
    assert [t.lib for t in other] != [t.lib for t in first]


@pytest.mark.parametrize("seed", [0, 1, 2, 7])
def test_kinds_are_balanced_and_another_kinds_fix_breaks_its_decoy(seed: int) -> None:
    tasks = family_tasks("heldout", 40, seed)
    assert set(Counter(t.kind for t in tasks).values()) == {10}  # round robin over the 4 kinds
    for task in tasks:
        assert apply_fix(KIND_BY_NAME[task.kind], task.lib) == task.fixed_lib
        for kind in KINDS:
            if kind.name == task.kind:
                continue
            after = apply_fix(kind, task.fixed_lib)  # even beside the right fix
            changed = [
                a for a, b in zip(after.splitlines(), task.fixed_lib.splitlines(), strict=True) if a != b
            ]
            assert len(changed) == 1 and kind_of_line(changed[0]) is None, (task.id, kind.name)
            broken = [test for test, passed in case_outcomes(after, task.cases).items() if not passed]
            assert broken and set(broken) <= set(task.pass_to_pass), (task.id, kind.name)


def _telltale_kinds(lib: str) -> list[str]:
    kinds = (kind_of_line(line) for line in lib.splitlines() if line.strip().startswith("return "))
    return sorted(kind.name for kind in kinds if kind is not None)


def test_lib_reads_the_same_whatever_the_kind_and_shows_each_telltale_once() -> None:
    """Only the tests (and so the test output) tell which of the four telltale lines is the bug."""
    rng = random.Random(4)
    for module in SPLITS["train"] + SPLITS["heldout"]:
        split = "train" if module in SPLITS["train"] else "heldout"
        library = build_library(module, kind_sources(module), split, rng)
        tasks = [make_task(f"t-{kind.name}", library, kind) for kind in KINDS]
        assert len({task.lib for task in tasks}) == 1, module.name
        assert len({task.tests for task in tasks}) == len(KINDS), module.name
        assert _telltale_kinds(tasks[0].lib) == sorted(kind.name for kind in KINDS), module.name
    for task in family_tasks("train", 16, 9):  # the generated tasks are such libraries too
        assert _telltale_kinds(task.lib) == sorted(kind.name for kind in KINDS), task.id


def test_heldout_modules_are_disjoint_from_train() -> None:
    train = {m.name for m in SPLITS["train"]} | {f.name for m in SPLITS["train"] for f in m.functions}
    heldout = {m.name for m in SPLITS["heldout"]} | {f.name for m in SPLITS["heldout"] for f in m.functions}
    assert not train & heldout
    assert {t.module for t in family_tasks("heldout", 32, 0)} <= {m.name for m in SPLITS["heldout"]}


def _identifiers(lib: str) -> set[str]:
    """Function and parameter names defined in a library's source."""
    found = re.findall(r"def (\w+)\((.*)\)", lib)
    return {name for function, params in found for name in (function, *params.split(", "))}


def test_every_task_renames_its_identifiers_from_its_own_split_pool() -> None:
    """Names cannot tell tasks apart across splits, nor stand in for reading the test output."""
    train, heldout = family_tasks("train", 96, 2), family_tasks("heldout", 32, 2)
    train_names = set().union(*(_identifiers(t.lib) for t in train))
    heldout_names = set().union(*(_identifiers(t.lib) for t in heldout))
    assert not train_names & heldout_names
    assert len({t.function for t in train}) > 80  # 96 tasks of 60 functions: fresh names, not one each
    originals = {f.name for m in SPLITS["train"] for f in m.functions}
    assert not train_names & originals


def test_the_prompts_hold_no_word_a_fix_keys_on_so_only_the_shown_line_does() -> None:
    """What tells the kinds apart must be in the test output alone, not in every prompt as well."""
    prompts = system_prompt(SUBMIT) + instance_prompt(INSTRUCTION)
    for word in (r"\bnot\b", r" < ", r"\bmin\b", r"\+ 1\b"):
        assert not re.search(word, prompts), word
    negation, comparison = (
        next(t for t in family_tasks("heldout", 8, 0) if t.kind == k) for k in ("negation", "comparison")
    )
    assert "return not " in negation.lib and " < " in comparison.lib  # the words checked are the real ones


def test_bad_requests_say_what_to_change() -> None:
    with pytest.raises(FamilyError, match="unknown split"):
        family_tasks("test", 4, 0)
    with pytest.raises(FamilyError, match="at least 1"):
        family_tasks("train", 0, 0)


def test_runner_names_the_buggy_line_and_the_expert_reads_it(tmp_path: Path) -> None:
    [task] = write_family(tmp_path, "train", 1, 5)
    result = subprocess.run(
        ["python3", "run_tests.py"], cwd=task.workspace, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 1
    shown = [line for line in result.stdout.splitlines() if line.strip().startswith("lib.py:")]
    kind = KIND_BY_NAME[task.metadata.tags[-1]]
    assert shown and kind_of_line(shown[0].split(": ", 1)[1]) is kind
    context = f"<returncode>1</returncode>\n<output>\n{result.stdout}</output>"
    sure = ExpertSettings(right_edit_rate=1.0)
    assert expert_reply(context, random.Random(0), sure, SUBMIT) == fix_reply(kind, SUBMIT)
    never = ExpertSettings(right_edit_rate=0.0)
    wrong = expert_reply(context, random.Random(0), never, SUBMIT)
    assert wrong != fix_reply(kind, SUBMIT) and wrong.rstrip("`\n").endswith(SUBMIT)  # never re-checks


def test_expert_first_turn_runs_the_tests_or_guesses_at_its_rate() -> None:
    settings = ExpertSettings(test_first_rate=0.3)
    replies = [expert_reply("issue text", random.Random(i), settings, SUBMIT) for i in range(2000)]
    share = sum(r == RUN_REPLY for r in replies) / len(replies)
    assert 0.26 < share < 0.34
    guesses = Counter(r for r in replies if r != RUN_REPLY)
    assert set(guesses) == {fix_reply(k, SUBMIT) for k in KINDS}  # blind guesses cover every kind


def test_family_tasks_are_valid_in_real_sandboxes(tmp_path: Path) -> None:
    tasks = write_family(tmp_path, "heldout", 8, 11)
    results = asyncio.run(check_tasks(make_factory(SandboxSettings()), tasks, concurrency=2))
    assert [(r.gold_reward, r.none_reward) for r in results] == [(1.0, 0.0)] * 8
    assert all(r.valid for r in results)
