"""The repository's arrows point one way (scripts/layering.py reads them from the source):
nothing in the product imports `bench/`, and inside `rollstream/` no library module imports a
command, no command imports another, no import closes a circle and the config imports only
settings."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _layering():
    spec = importlib.util.spec_from_file_location("layering", ROOT / "scripts" / "layering.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["layering"] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


layering = _layering()


def test_the_product_does_not_import_bench() -> None:
    found = layering.scan(ROOT).bench_in_product
    assert not found, "\n".join(f"{a.path}:{a.line} imports {a.target}" for a in found)


def test_no_import_points_back_up_inside_rollstream() -> None:
    found = layering.scan(ROOT).back_arrows
    assert not found, "\n".join(f"{a.path}:{a.line} -> {a.target}: {why}" for why, a in found)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def test_the_scan_sees_each_kind_of_wrong_arrow(tmp_path: Path) -> None:
    """The rules catch what they are for, on a small tree written here (lazy and importlib too)."""
    root = _tree(
        tmp_path,
        {
            "bench/__init__.py": "",
            "bench/gen.py": "",
            "rollstream/__init__.py": "",
            "rollstream/config.py": "from rollstream.runner import RunnerSettings\n",
            "rollstream/runner.py": "def run():\n    from rollstream.commands import up\n",
            "rollstream/report.py": "from . import summary\n",
            "rollstream/summary.py": "import rollstream.report\n",
            "rollstream/commands/__init__.py": "",
            "rollstream/commands/up.py": "from rollstream.commands.tail import rows\n",
            "rollstream/commands/tail.py": "import importlib\nimportlib.import_module('bench.gen')\n",
        },
    )
    scan = layering.scan(root)
    assert [(a.path, a.target) for a in scan.bench_in_product] == [
        ("rollstream/commands/tail.py", "bench.gen")
    ]
    kinds = sorted((why, a.source, a.target) for why, a in scan.back_arrows)
    assert kinds == [
        ("closes a circle", "rollstream.report", "rollstream.summary"),
        ("closes a circle", "rollstream.summary", "rollstream.report"),
        ("command imports a command", "rollstream.commands.up", "rollstream.commands.tail"),
        ("config imports more than settings", "rollstream.config", "rollstream.runner"),
        ("library imports a command", "rollstream.runner", "rollstream.commands.up"),
    ]
    assert next(a for _, a in scan.back_arrows if a.source == "rollstream.runner").lazy


def test_no_file_is_over_400_lines() -> None:
    """The house rule on file size (product, benchmarks, scripts and tests): split by what a part is."""
    found = layering.scan(ROOT).big_files
    assert not found, "\n".join(f"{path}: {lines} lines" for path, lines in found)
