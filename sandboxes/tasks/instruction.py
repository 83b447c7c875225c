"""Issue-style task text written from the failing tests' names and assertion messages.

The text never comes from the diff: it names the failing tests, quotes their one-line
failure messages (cut to `MESSAGE_CHARS`), says how to run them, and asks for a fix in
the library rather than the tests. Any message line that contains one of `redact`
(the mutated source lines, passed by the builder as a safety net) is left out.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

MESSAGE_CHARS = 300
LISTED_TESTS = 8

_OPENINGS = (
    "After the latest changes to `{library}`, some of its tests fail.",
    "I am seeing test failures in `{library}` that were not there before.",
    "Something in `{library}` regressed: the test suite no longer passes.",
)
_CLOSINGS = (
    "Please find the bug in the library code and fix it. Do not change the tests; "
    "the rest of the test suite must keep passing.",
    "Fix the library so these tests pass again, without editing the tests and without "
    "breaking any other test.",
)


@dataclass(frozen=True)
class FailingTest:
    node_id: str
    message: str = ""


def _humanize(node_id: str) -> str:
    name = node_id.split("::")[-1].split("[")[0]
    name = re.sub(r"^test_?", "", name)
    return name.replace("_", " ").strip() or node_id


def _clean(message: str, redact: Sequence[str]) -> str:
    message = " ".join(message.split())
    if any(snippet and snippet in message for snippet in redact):
        return ""
    return message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 3] + "..."


def write_instruction(
    library: str,
    failing: Sequence[FailingTest],
    *,
    pythonpath: str = "",
    redact: Sequence[str] = (),
    variant_key: str = "",
) -> str:
    """The instruction.md text; `variant_key` picks the wording deterministically."""
    if not failing:
        raise ValueError("an instruction needs at least one failing test")
    digest = int(hashlib.sha256(variant_key.encode()).hexdigest(), 16)
    shown = list(failing)[:LISTED_TESTS]
    lines = [f"# {library}: {_humanize(shown[0].node_id)} is broken", ""]
    lines += [_OPENINGS[digest % len(_OPENINGS)].format(library=library), ""]
    lines += ["These tests fail:" if len(failing) > 1 else "This test fails:", ""]
    for test in shown:
        lines.append(f"- `{test.node_id}`")
        message = _clean(test.message, redact)
        if message:
            lines.append(f"  - fails with: `{message}`")
    if len(failing) > len(shown):
        lines.append(f"- ... and {len(failing) - len(shown)} more tests")
    env = f"PYTHONHASHSEED=0 PYTHONPATH={pythonpath} " if pythonpath else "PYTHONHASHSEED=0 "
    ids = " ".join(shlex.quote(t.node_id) for t in shown[:3])
    lines += [
        "",
        _CLOSINGS[(digest // 7) % len(_CLOSINGS)],
        "",
        "To reproduce:",
        "",
        "```",
        f"{env}python3 -m pytest -q {ids}",
        "```",
        "",
    ]
    return "\n".join(lines)
