"""The documentation: generated reference pages match the code, and the README's links lead somewhere.

`mkdocs build --strict` (scripts/test.sh) checks the site's own links; these tests check what it
cannot: that docs/reference/cli.md and docs/reference/sql.md are what scripts/generate_docs.py
writes from the Typer app and the SQLAlchemy models today, and that the README, which mkdocs
does not build, links only to files that exist.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
README_MAX_LINES = 200


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate_docs", ROOT / "scripts" / "generate_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("page", ["docs/reference/cli.md", "docs/reference/sql.md"])
def test_generated_page_is_current(page: str) -> None:
    generator = load_generator()
    expected = generator.GENERATED[page]()
    path = ROOT / page
    committed = path.read_text() if path.exists() else ""
    if committed != expected:
        diff = "".join(
            list(
                difflib.unified_diff(
                    committed.splitlines(keepends=True),
                    expected.splitlines(keepends=True),
                    f"{page} (committed)",
                    f"{page} (from the code)",
                )
            )[:40]
        )
        pytest.fail(f"{page} is stale: run `{generator.REGENERATE}` and commit it.\n{diff}")


def test_escape_markdown_keeps_code_and_escapes_what_markdown_would_eat() -> None:
    escape = load_generator().escape_markdown
    assert escape("under <state_dir>/kafka") == "under &lt;state\\_dir&gt;/kafka"
    assert escape("set `policy.max_turns=40` or a*b") == "set `policy.max_turns=40` or a\\*b"
    assert escape("[default: 3]") == "\\[default: 3\\]"


def test_readme_is_short_and_its_links_exist() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES, "README.md: keep it short; details go in docs/"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert local, "the README links into docs/"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
