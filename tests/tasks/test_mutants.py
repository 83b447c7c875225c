"""Keep/reject rules, deduplication, coverage-guided candidate order, instruction text."""

from __future__ import annotations

from sandboxes.tasks.instruction import FailingTest, write_instruction
from sandboxes.tasks.mutants import Coverage, Deduper, SuiteRun, judge, order_candidates
from sandboxes.tasks.mutators import Edit, Mutation, apply_mutation, find_mutations
from sandboxes.tasks.runtime import parse_summary
from sandboxes.tasks.writer import changed_lines, gold_patch

PASSING = frozenset({"t::a", "t::b", "t::c"})


def mutation(function: str = "f", line: int = 1, path: str = "m.py", start: int = 0) -> Mutation:
    return Mutation("flip_comparison", path, function, line, line, "", (Edit(start, start + 1, "x"),))


def run(**outcomes: str) -> SuiteRun:
    return SuiteRun({f"t::{name}": (outcome, f"{name} says no") for name, outcome in outcomes.items()})


def test_keeps_a_mutant_that_fails_some_tests_and_passes_the_rest() -> None:
    verdict = judge(run(a="FAILED", b="PASSED", c="PASSED"), PASSING, max_fail_to_pass=10)
    assert verdict.kept and verdict.reason == "kept"
    assert verdict.fail_to_pass == ("t::a",)
    assert verdict.pass_to_pass == ("t::b", "t::c")
    assert verdict.messages == {"t::a": "a says no"}


def test_errors_count_as_failures() -> None:
    verdict = judge(run(a="ERROR", b="PASSED", c="PASSED"), PASSING, max_fail_to_pass=10)
    assert verdict.kept and verdict.fail_to_pass == ("t::a",)


def test_rejects_mutants_that_change_nothing_hang_or_break_too_much() -> None:
    assert judge(run(a="PASSED", b="PASSED", c="PASSED"), PASSING, 10).reason == "no_test_fails"
    assert judge(SuiteRun({}, timed_out=True), PASSING, 10).reason == "timeout"
    assert judge(SuiteRun({}), PASSING, 10).reason == "no_test_results"
    assert judge(run(a="FAILED", b="FAILED", c="PASSED"), PASSING, 1).reason == "too_many_failures"


def test_rejects_when_a_failing_test_did_not_run_at_all() -> None:
    assert judge(run(a="FAILED", b="PASSED"), PASSING, 10).reason == "tests_not_run"


def test_deduper_rejects_same_program_same_failures_and_function_quota() -> None:
    deduper = Deduper(max_per_function=2)
    first = mutation("f", 1)
    assert deduper.check(first, "prog1", ("t::a",)) is None
    deduper.admit(first, "prog1", ("t::a",))
    assert deduper.check(mutation("g", 9), "prog1", ("t::b",)) == "duplicate_program"
    assert deduper.check(mutation("f", 1, start=5), "prog2", ("t::a",)) == "duplicate_failures"
    assert deduper.check(mutation("f", 1, start=5), "prog2", ("t::b",)) is None
    deduper.admit(mutation("f", 1, start=5), "prog2", ("t::b",))
    assert deduper.check(mutation("f", 1, start=7), "prog3", ("t::c",)) == "function_quota"
    assert deduper.check(mutation("g", 9), "prog3", ("t::c",)) is None


def coverage() -> Coverage:
    data = {
        "functions": [["m.py", 1], ["m.py", 10], ["m.py", 20], ["m.py", 30]],
        "outside": [2],  # ran at import time
        "tests": {"t::a": [0, 2], "t::b": [1], "t::failing": [3]},
    }
    return Coverage.from_plugin(data, frozenset({"t::a", "t::b"}))


def test_coverage_keeps_passing_tests_and_marks_import_time_functions() -> None:
    cover = coverage()
    assert cover.tests_for(mutation("f", 1)) == {"t::a"}
    assert cover.tests_for(mutation("g", 10)) == {"t::b"}
    assert cover.tests_for(mutation("h", 20)) == frozenset(), "import-time functions are never mutated"
    assert cover.tests_for(mutation("k", 30)) == frozenset(), "only covered by a failing test"


def test_candidate_order_is_seeded_and_visits_every_function_first() -> None:
    candidates = [mutation("f", 1, start=i) for i in range(3)] + [
        mutation("g", 10, start=i) for i in range(3)
    ]
    candidates += [mutation("h", 20), mutation("k", 30)]
    ordered = order_candidates(candidates, coverage(), seed=1)
    assert ordered == order_candidates(candidates, coverage(), seed=1)
    assert {m.function for m in ordered} == {"f", "g"}
    assert {m.function for m in ordered[:2]} == {"f", "g"}
    assert len(ordered) == 6
    orders = {tuple(m.key for m in order_candidates(candidates, coverage(), seed=s)) for s in range(8)}
    assert len(orders) > 1, "different seeds give different orders"


def test_instruction_names_failing_tests_and_never_contains_the_diff() -> None:
    source = (
        "def clamp(value, low, high):\n    if value < low:\n        return low\n    return min(value, high)\n"
    )
    flip = next(m for m in find_mutations(source, "lib.py") if m.kind == "flip_comparison")
    mutated = apply_mutation(source, flip)
    patch = gold_patch("lib.py", source, mutated)
    failing = [
        FailingTest("tests/test_lib.py::test_clamp_low", "AssertionError: assert 3 == 1"),
        # a message quoting the mutated source line must be dropped (redacted)
        FailingTest("tests/test_lib.py::test_clamp_edge", "in clamp: if value <= low: raise"),
    ]
    text = write_instruction(
        "lib", failing, pythonpath="src", redact=changed_lines(source, mutated), variant_key="t1"
    )
    assert "tests/test_lib.py::test_clamp_low" in text and "assert 3 == 1" in text
    assert "tests/test_lib.py::test_clamp_edge" in text
    assert "value <= low" not in text and "value < low" not in text
    for line in patch.splitlines():
        if line.startswith(("+", "-")) and not line.startswith(("+++", "---")):
            assert line[1:].strip() not in text
    assert "PYTHONPATH=src" in text
    assert write_instruction("lib", failing, variant_key="t1") == write_instruction(
        "lib", failing, variant_key="t1"
    )


def test_gold_patch_reverses_the_mutation() -> None:
    source = "def f(x):\n    return x < 3\n"
    flip = next(m for m in find_mutations(source, "pkg/f.py") if m.kind == "flip_comparison")
    patch = gold_patch("pkg/f.py", source, apply_mutation(source, flip))
    assert patch.startswith("--- a/pkg/f.py\n+++ b/pkg/f.py\n")
    assert "-    return x <= 3\n+    return x < 3\n" in patch


def test_summary_lines_with_dashes_and_brackets_in_ids() -> None:
    output = "\n".join(
        [
            "PASSED tests/t.py::test_sql[a - b where c < d + interval '1 day'-Identifier]",
            "FAILED tests/t.py::test_sql[x - y] - AssertionError: assert [1] == [2]",
            "FAILED tests/t.py::test_plain - assert [1] - [2]",
            "ERROR tests/t.py::test_err",
            "FAILED tests/t.py::test_only[no - message]",
            "1 failed, 1 passed in 0.1s",
        ]
    )
    assert parse_summary(output) == {
        "tests/t.py::test_sql[a - b where c < d + interval '1 day'-Identifier]": ("PASSED", ""),
        "tests/t.py::test_sql[x - y]": ("FAILED", "AssertionError: assert [1] == [2]"),
        "tests/t.py::test_plain": ("FAILED", "assert [1] - [2]"),
        "tests/t.py::test_err": ("ERROR", ""),
        "tests/t.py::test_only[no - message]": ("FAILED", ""),
    }


def test_grader_needs_every_listed_test_passed(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from sandboxes.tasks.runtime import grade_source

    (tmp_path / "grade.py").write_text(grade_source())
    listed = {"fail_to_pass": ["t.py::f[a - b]"], "pass_to_pass": ["t.py::p", "t.py::gone"]}
    (tmp_path / "tests.json").write_text(json.dumps(listed))
    log = "PASSED t.py::f[a - b]\nPASSED t.py::p\nFAILED t.py::p - flaky second run\n"
    (tmp_path / "pytest.log").write_text(log)
    args = [sys.executable, "grade.py", "tests.json", "pytest.log", "."]
    subprocess.run(args, cwd=tmp_path, check=True)
    assert (tmp_path / "reward.txt").read_text().strip() == "0"
    results = json.loads((tmp_path / "results.json").read_text())
    assert results == {
        "fail_to_pass": {"t.py::f[a - b]": True},
        "pass_to_pass": {"t.py::p": False, "t.py::gone": False},  # a FAILED line wins; missing = failed
    }
    listed["pass_to_pass"] = []
    (tmp_path / "tests.json").write_text(json.dumps(listed))
    subprocess.run(args, cwd=tmp_path, check=True)
    assert (tmp_path / "reward.txt").read_text().strip() == "1"
