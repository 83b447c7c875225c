"""What runs inside the sandbox: a zipped pytest, the coverage plugin, the grader, test.sh.

The bwrap sandbox has only the host's `/usr` (so `/usr/bin/python3`, no pytest). Every
task therefore ships `tests/pytest.pyz` (pytest and its pure-Python dependencies, with
byte code; put on PYTHONPATH), plus `tests/grade.py`, which reads pytest's `-rA`-style
summary and writes `reward.txt` (1 only when every FAIL_TO_PASS and PASS_TO_PASS test
PASSED) and `results.json` (per-test outcome) into `$LOGS_DIR` (Harbor: /logs/verifier).

test.sh exits without a reward when python3 or pytest cannot run at all: that is an
infrastructure failure for the verifier, never a reward of 0.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import zipfile
from collections.abc import Sequence
from pathlib import Path

RUNTIME_PACKAGES = ("_pytest", "pytest", "pluggy", "iniconfig", "packaging", "py")
COVER_PLUGIN = "rollstream_cover"
SUMMARY_OUTCOMES = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS")
PYTEST_FLAGS = "-p no:cacheprovider -o addopts= -q -rpfExX --tb=no --color=no"
# Address randomization makes ids of tests parametrized from sets (ordered by hash(None)...) vary.
NO_ASLR = 'NOASLR=""; if setarch -R true 2>/dev/null; then NOASLR="setarch -R"; fi; '


_COVER_PLUGIN_SOURCE = '''
"""Records, per test, which functions of the repository ran (sys.setprofile, call events)."""
import json, os, sys, threading

_cache, _state = {}, {"current": set()}
_outside = _state["current"]
_tests = {}

def _profile(frame, event, arg):
    if event != "call":
        return
    code = frame.f_code
    key = _cache.get(code)
    if key is None:
        name = code.co_filename
        if not os.path.isabs(name):
            name = os.path.join(_ROOT, name)
        inside = name.startswith(_ROOT) and "/site-packages/" not in name and name.endswith(".py")
        key = (os.path.relpath(name, _ROOT), code.co_firstlineno) if inside else False
        _cache[code] = key
    if key:
        _state["current"].add(key)

_ROOT = os.getcwd() + os.sep

def pytest_addoption(parser):
    parser.addoption("--rollstream-cover", default="", help="write per-test coverage JSON here")

def pytest_configure(config):
    if config.getoption("rollstream_cover"):
        sys.setprofile(_profile)
        threading.setprofile(_profile)

import pytest

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _state["current"] = set()
    yield
    _tests[item.nodeid] = _state["current"]
    _state["current"] = _outside

def pytest_unconfigure(config):
    out = config.getoption("rollstream_cover")
    if not out:
        return
    sys.setprofile(None)
    threading.setprofile(None)
    functions = sorted(set().union(_outside, *_tests.values()))
    index = {f: i for i, f in enumerate(functions)}
    data = {
        "functions": functions,
        "outside": sorted(index[f] for f in _outside),
        "tests": {t: sorted(index[f] for f in fs) for t, fs in _tests.items()},
    }
    with open(out, "w") as fh:
        json.dump(data, fh)
'''

_GRADE_SOURCE = '''
"""Grades one verifier run: reward 1 only when every listed test PASSED in pytest's summary."""
import json, sys

OUTCOMES = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS")


def split(rest):
    """node id and message; an id may itself contain " - " inside its [parameters]."""
    cut = rest.find(" - ")
    if cut >= 0 and "[" in rest[:cut]:
        cut = rest.find("] - ")
        cut = cut + 1 if cut >= 0 else -1
    return (rest, "") if cut < 0 else (rest[:cut], rest[cut + 3:])


config_path, log_path, logs_dir = sys.argv[1:4]
with open(config_path) as fh:
    config = json.load(fh)
outcomes = {}
with open(log_path, errors="replace") as fh:
    for line in fh:
        outcome, _, rest = line.rstrip("\\n").partition(" ")
        if outcome not in OUTCOMES or not rest:
            continue
        test = rest if outcome == "PASSED" else split(rest)[0]
        if outcomes.get(test) != "FAILED":
            outcomes[test] = outcome
results = {
    group: {test: outcomes.get(test) == "PASSED" for test in config[group]}
    for group in ("fail_to_pass", "pass_to_pass")
}
reward = 1 if all(all(r.values()) for r in results.values()) else 0
with open(f"{logs_dir}/results.json", "w") as fh:
    json.dump(results, fh)
with open(f"{logs_dir}/reward.txt", "w") as fh:
    fh.write(f"{reward}\\n")
'''

_TEST_SH = """#!/usr/bin/env bash
# Verifier: restores the original test files, runs the FAIL_TO_PASS and PASS_TO_PASS tests
# (listed in tests.json) with pytest and grades them. Writes $LOGS_DIR/reward.txt.
# Exits 2 without a reward when python3 or pytest cannot run (an infrastructure failure).
set -u
TESTS_DIR="${{TESTS_DIR:-/tests}}"
LOGS_DIR="${{LOGS_DIR:-/logs/verifier}}"
mkdir -p "$LOGS_DIR"
cd "${{REPO_DIR:-$PWD}}"
# Test files the agent may have edited or added are replaced by the originals.
for path in {restore}; do rm -rf "./$path"; done
if [ -d "$TESTS_DIR/suite" ]; then cp -R "$TESTS_DIR/suite/." . ; fi
export PYTHONPATH="{pythonpath}$TESTS_DIR/pytest.pyz"
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 PYTHONHASHSEED=0 COLUMNS=400
if ! {python} -c "import pytest" > "$LOGS_DIR/setup.log" 2>&1; then
  echo "verifier cannot import pytest with {python}: see $LOGS_DIR/setup.log" >&2
  exit 2
fi
# Without address randomization, test ids built from sets of objects hashed by address are stable.
{no_aslr}
$NOASLR {python} -m pytest {flags} {test_ids} > "$LOGS_DIR/pytest.log" 2>&1
{python} "$TESTS_DIR/grade.py" "$TESTS_DIR/tests.json" "$LOGS_DIR/pytest.log" "$LOGS_DIR" || exit 2
"""


def pythonpath_prefix(source_roots: list[str]) -> str:
    """PYTHONPATH entries (absolute, from the repo root) that make the package importable."""
    return "".join(f"$PWD/{root}:" if root != "." else "$PWD:" for root in source_roots)


def verifier_script(
    test_ids: list[str], source_roots: list[str], python: str, restore: Sequence[str] = ()
) -> str:
    """test.sh: `restore` lists the repo paths (test dirs, config files) replaced from tests/suite/."""
    return _TEST_SH.format(
        restore=" ".join(shlex.quote(path) for path in restore),
        pythonpath=pythonpath_prefix(source_roots),
        python=python,
        flags=PYTEST_FLAGS,
        no_aslr=NO_ASLR.strip(),
        test_ids=" ".join(shlex.quote(t) for t in test_ids),
    )


def write_grader(tests_dir: Path, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str]) -> None:
    """grade.py and tests.json (the tests it grades) into an existing task tests/ directory."""
    (tests_dir / "grade.py").write_text(grade_source())
    (tests_dir / "tests.json").write_text(
        json.dumps({"fail_to_pass": list(fail_to_pass), "pass_to_pass": list(pass_to_pass)}, indent=1)
    )


def write_runtime_files(tests_dir: Path, pyz: Path, fail_to_pass: list[str], pass_to_pass: list[str]) -> None:
    """grade.py, tests.json and pytest.pyz (hard-linked when possible) into a task's tests/."""
    tests_dir.mkdir(parents=True, exist_ok=True)
    write_grader(tests_dir, fail_to_pass, pass_to_pass)
    target = tests_dir / "pytest.pyz"
    target.unlink(missing_ok=True)
    try:
        target.hardlink_to(pyz)
    except OSError:
        target.write_bytes(pyz.read_bytes())


def grade_source() -> str:
    """The grader script (pure Python, no dependencies) placed in a task's tests/."""
    return _GRADE_SOURCE.lstrip()


def split_summary(rest: str) -> tuple[str, str]:
    """(node id, message) of a summary line's text after the outcome word.

    The message follows " - ", which may also occur inside an id's [parameters]: when
    the text before the first " - " opens a "[", the id ends at the first "] - "."""
    cut = rest.find(" - ")
    if cut >= 0 and "[" in rest[:cut]:
        cut = rest.find("] - ")
        cut = cut + 1 if cut >= 0 else -1
    return (rest, "") if cut < 0 else (rest[:cut], rest[cut + 3 :])


def parse_summary(output: str) -> dict[str, tuple[str, str]]:
    """pytest `-r` summary lines -> {node id: (outcome, message)}; a FAILED outcome wins.
    PASSED lines carry no message, so their whole text is the id."""
    results: dict[str, tuple[str, str]] = {}
    for line in output.splitlines():
        outcome, _, rest = line.partition(" ")
        if outcome not in SUMMARY_OUTCOMES or not rest:
            continue
        test, message = (rest, "") if outcome == "PASSED" else split_summary(rest)
        if results.get(test, ("",))[0] != "FAILED":
            results[test] = (outcome, message)
    return results


def ensure_pytest_zip(cache_dir: Path) -> Path:
    """A zip of pytest and its pure-Python dependencies, sources plus byte code (cached)."""
    import pytest

    path = cache_dir / f"pytest-{pytest.__version__}-rollstream1.pyz"
    if path.is_file():
        return path
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with zipfile.PyZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name in RUNTIME_PACKAGES:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.origin is None:
                continue
            origin = Path(spec.origin)
            root = origin.parent if origin.name == "__init__.py" else origin
            archive.writepy(str(root))  # byte code, so the sandbox need not compile pytest
            _add_sources(archive, root)
        archive.writestr(f"{COVER_PLUGIN}.py", _COVER_PLUGIN_SOURCE.lstrip())
    partial.rename(path)
    return path


def _add_sources(archive: zipfile.ZipFile, root: Path) -> None:
    """Sources too: zipimport falls back to them when the sandbox's Python differs."""
    base = root.parent
    files = [root] if root.is_file() else sorted(root.rglob("*.py"))
    for file in files:
        if "__pycache__" not in file.parts:
            archive.write(file, file.relative_to(base).as_posix())
