"""What runs inside a family task's sandbox: the test runner (`run_tests.py`) and `tests/test.sh`.

`python3 run_tests.py` (what the agent runs) calls every case of `tests/test_lib.py`,
and prints each failing case with the line of `lib.py` that produced the value (the
last line traced in `lib.py`), at most `--show` of them, then a
summary; it exits 1 when a case fails. With `--grade IDS.json --logs DIR` (what test.sh runs, after it
has restored the original tests and runner) it also writes `DIR/results.json` (per test
id) and `DIR/reward.txt` (1 only when every listed test passes). A `lib.py` that does
not import fails every case; that is a reward of 0, not a verifier error.
"""

from __future__ import annotations

RUNNER_SOURCE = r'''"""Run the cases in tests/test_lib.py on lib.py; show where each wrong value came from."""
import argparse
import json
import linecache
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True


def load(path):
    namespace = {}
    with open(path) as source:
        exec(compile(source.read(), path, "exec"), namespace)
    return namespace["CASES"]


def traced_call(call, args):
    """(value or exception, last line of lib.py that ran)."""
    lines = []

    def tracer(frame, event, arg):
        if os.path.basename(frame.f_code.co_filename) != "lib.py":
            return None
        if event == "line":
            lines.append(frame.f_lineno)
        return tracer

    sys.settrace(tracer)
    try:
        return call(*args), None, (lines[-1] if lines else None)
    except Exception as error:  # a case that raises fails, with the error shown
        return None, error, (lines[-1] if lines else None)
    finally:
        sys.settrace(None)


def run(cases, show):
    try:
        import lib
    except Exception as error:
        print(f"ERROR importing lib.py: {type(error).__name__}: {error}")
        return {f"{name}[{i}]": False for i, (name, _, _) in enumerate(cases)}, len(cases)
    results, counts, shown, failed = {}, {}, 0, 0
    for name, args, expected in cases:
        index = counts[name] = counts.get(name, -1) + 1
        call = getattr(lib, name, None)
        if call is None:
            value, error, line = None, AttributeError(f"lib.py has no {name}"), None
        else:
            value, error, line = traced_call(call, args)
        passed = error is None and value == expected and type(value) is type(expected)
        results[f"{name}[{index}]"] = passed
        if passed:
            continue
        failed += 1
        if shown < show:
            shown += 1
            call_text = f"{name}({', '.join(repr(a) for a in args)})"
            got = f"raised {type(error).__name__}" if error else f"got {value!r}"
            print(f"FAIL {call_text}: {got}, expected {expected!r}")
            if line is not None:
                print(f"  lib.py:{line}: {linecache.getline('lib.py', line).strip()}")
    print(f"{len(cases) - failed} passed, {failed} failed")
    return results, failed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--show", type=int, default=1)
    parser.add_argument("--grade", default="")
    parser.add_argument("--logs", default="")
    options = parser.parse_args()
    os.chdir(os.path.dirname(os.path.abspath(__file__)))
    results, failed = run(load("tests/test_lib.py"), options.show)
    if options.grade:
        with open(options.grade) as source:
            ids = json.load(source)
        prefix = "tests/test_lib.py::"
        graded = {
            group: {test: results.get(test[len(prefix):], False) for test in ids[group]}
            for group in ("fail_to_pass", "pass_to_pass")
        }
        ok = all(all(group.values()) for group in graded.values())
        with open(os.path.join(options.logs, "results.json"), "w") as out:
            json.dump(graded, out)
        with open(os.path.join(options.logs, "reward.txt"), "w") as out:
            out.write("1\n" if ok else "0\n")
    sys.exit(1 if failed else 0)


main()
'''

# Restores the original tests and runner first, so an agent that edited them gains nothing.
TEST_SH = """#!/usr/bin/env bash
set -u
cd "${{REPO_DIR:-$PWD}}"
TESTS_DIR="${{TESTS_DIR:-/tests}}"
LOGS_DIR="${{LOGS_DIR:-/logs/verifier}}"
mkdir -p tests "$LOGS_DIR"
cp "$TESTS_DIR/test_lib.py" tests/test_lib.py && cp "$TESTS_DIR/run_tests.py" run_tests.py || exit 3
command -v {python} >/dev/null || {{ echo "{python} not found"; exit 3; }}
{python} run_tests.py --show 0 --grade "$TESTS_DIR/ids.json" --logs "$LOGS_DIR"
exit 0
"""
