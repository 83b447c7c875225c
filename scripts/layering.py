"""The repository's structure, read from its source with `ast`: no module is imported.

Prints (or returns, from `scan`) what the house rules constrain:

- package arrows: imports between the top-level packages (`rollstream`, `trainer`, `agents`,
  `sandboxes`, `streams`, `bench`, `tests`, `scripts`), with how many import statements make
  each arrow; lazy ones (inside a function) count too, and so does
  `importlib.import_module("bench...")` with a literal name;
- product imports of `bench/`: a module of a product package that imports `bench` (the
  product must not depend on its benchmarks; tests and scripts may);
- back arrows inside `rollstream/`: a library module (anything but `cli.py`, `__main__.py`
  and `commands/`) that imports `rollstream.cli` or `rollstream.commands`; a command
  module that imports another command module (commands import library modules, never each
  other); and any import that closes a circle between modules of `rollstream/`;
- sizes: lines and files per package, the files over `--max-lines` lines and the longest
  functions (decorators and docstring included).

`python scripts/layering.py` prints a summary; `--json` prints the whole scan as JSON.
`tests/test_layering.py` uses `scan` to fail on a back arrow or a product import of `bench/`.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("rollstream", "trainer", "agents", "sandboxes", "streams", "migrations")
PACKAGES = (*PRODUCT, "bench", "tests", "scripts")
SKIP_DIRS = {".venv", ".git", "site", "node_modules", "__pycache__", ".rollstream"}
COMMAND_LAYER = ("rollstream.cli", "rollstream.__main__", "rollstream.commands")


@dataclass(frozen=True)
class Arrow:
    """One import statement from module `source` (file `path`, line `line`) to module `target`."""

    source: str
    target: str
    path: str
    line: int
    lazy: bool


@dataclass(frozen=True)
class Function:
    name: str
    path: str
    line: int
    lines: int


@dataclass
class Layering:
    package_arrows: dict[str, int] = field(default_factory=dict)
    package_lines: dict[str, int] = field(default_factory=dict)
    package_files: dict[str, int] = field(default_factory=dict)
    bench_in_product: list[Arrow] = field(default_factory=list)
    tests_importing_bench: list[str] = field(default_factory=list)
    back_arrows: list[tuple[str, Arrow]] = field(default_factory=list)
    big_files: list[tuple[str, int]] = field(default_factory=list)
    longest_functions: list[Function] = field(default_factory=list)
    functions_over: int = 0


def python_files(root: Path) -> list[Path]:
    found = []
    for package in PACKAGES:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            if not SKIP_DIRS.intersection(path.relative_to(root).parts):
                found.append(path)
    return found


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(root: Path, base: str, name: str | None) -> str:
    """`from base import name`: the module `base.name` where that is a module, else `base`."""
    if name:
        candidate = f"{base}.{name}"
        as_path = root.joinpath(*candidate.split("."))
        if as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file():
            return candidate
    return base


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    prefix = parts[:keep]
    return ".".join([*prefix, node.module] if node.module else prefix)


def _literal_prefix(arg: ast.expr) -> str | None:
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    if isinstance(arg, ast.JoinedStr) and arg.values:
        first = arg.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value.rstrip(".")
    return None


class _Imports(ast.NodeVisitor):
    def __init__(self, root: Path, path: Path, module: str) -> None:
        self.root, self.path, self.module = root, path, module
        self.is_package = path.name == "__init__.py"
        self.depth = 0
        self.arrows: list[Arrow] = []
        self.functions: list[Function] = []

    def _add(self, target: str, line: int) -> None:
        if target.split(".")[0] in PACKAGES:
            rel = str(self.path.relative_to(self.root))
            self.arrows.append(Arrow(self.module, target, rel, line, self.depth > 0))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _absolute(self.module, self.is_package, node)
        for alias in node.names:
            self._add(_resolve(self.root, base, alias.name), node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "import_module" and node.args:
            prefix = _literal_prefix(node.args[0])
            if prefix:
                self._add(prefix, node.lineno)
        self.generic_visit(node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        rel = str(self.path.relative_to(self.root))
        self.functions.append(Function(node.name, rel, start, node.end_lineno - start + 1))
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function


def _is_command_layer(module: str) -> bool:
    return any(module == c or module.startswith(c + ".") for c in COMMAND_LAYER)


def _is_command(module: str) -> bool:
    return module.startswith("rollstream.commands.")


def _circles(arrows: list[Arrow]) -> list[Arrow]:
    """The arrows inside `rollstream/` that close a circle: target reaches source again."""
    inner = [a for a in arrows if a.source.startswith("rollstream") and a.target.startswith("rollstream")]
    graph: dict[str, set[str]] = {}
    for a in inner:
        graph.setdefault(a.source, set()).add(a.target)

    def reaches(start: str, goal: str) -> bool:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False

    # A package's __init__ importing its own submodules is not a circle worth naming.
    return [
        a
        for a in inner
        if a.source != a.target
        and not a.target.startswith(a.source + ".")
        and not a.source.startswith(a.target + ".")
        and reaches(a.target, a.source)
    ]


def back_arrows(arrows: list[Arrow]) -> list[tuple[str, Arrow]]:
    found: list[tuple[str, Arrow]] = []
    for a in arrows:
        if not a.source.startswith("rollstream") or not a.target.startswith("rollstream"):
            continue
        if not _is_command_layer(a.source) and _is_command_layer(a.target):
            found.append(("library imports a command", a))
        elif _is_command(a.source) and _is_command(a.target) and a.target != "rollstream.commands":
            found.append(("command imports a command", a))
    for a in arrows:
        # The config is the floor of rollstream/: it reads settings, it does not run anything.
        name = a.target.rsplit(".", 1)[-1]
        if a.source == "rollstream.config" and a.target.startswith("rollstream.") and "settings" not in name:
            found.append(("config imports more than settings", a))
    listed = {id(a) for _, a in found}
    found += [("closes a circle", a) for a in _circles(arrows) if id(a) not in listed]
    return found


def scan(root: Path = ROOT, max_lines: int = 400, max_function: int = 50) -> Layering:
    result = Layering()
    arrows: list[Arrow] = []
    functions: list[Function] = []
    lines_per_package: Counter[str] = Counter()
    files_per_package: Counter[str] = Counter()
    for path in python_files(root):
        text = path.read_text(encoding="utf-8")
        module = module_name(root, path)
        package = module.split(".")[0]
        count = len(text.splitlines())
        lines_per_package[package] += count
        files_per_package[package] += 1
        if count > max_lines:
            result.big_files.append((str(path.relative_to(root)), count))
        visitor = _Imports(root, path, module)
        visitor.visit(ast.parse(text, filename=str(path)))
        arrows += list(dict.fromkeys(visitor.arrows))  # one arrow per statement and target
        functions += visitor.functions
    package_arrows: Counter[str] = Counter()
    for a in arrows:
        source, target = a.source.split(".")[0], a.target.split(".")[0]
        if source != target:
            package_arrows[f"{source} -> {target}"] += 1
    result.package_arrows = dict(sorted(package_arrows.items()))
    result.package_lines = dict(lines_per_package)
    result.package_files = dict(files_per_package)
    result.bench_in_product = [
        a for a in arrows if a.source.split(".")[0] in PRODUCT and a.target.split(".")[0] == "bench"
    ]
    result.tests_importing_bench = sorted(
        {a.path for a in arrows if a.source.startswith("tests") and a.target.split(".")[0] == "bench"}
    )
    result.back_arrows = back_arrows(arrows)
    result.big_files.sort(key=lambda item: -item[1])
    functions.sort(key=lambda f: -f.lines)
    result.longest_functions = functions[:20]
    result.functions_over = sum(
        1 for f in functions if f.lines > max_function and not f.path.startswith("tests")
    )
    return result


def summary(layering: Layering, max_function: int) -> str:
    out = ["package arrows (import statements):"]
    out += [f"  {arrow}: {n}" for arrow, n in layering.package_arrows.items()]
    out.append("package sizes (lines / files):")
    for package, lines in sorted(layering.package_lines.items(), key=lambda kv: -kv[1]):
        out.append(f"  {package}: {lines} / {layering.package_files[package]}")
    out.append(f"product imports of bench/: {len(layering.bench_in_product)}")
    out += [f"  {a.path}:{a.line} -> {a.target}" for a in layering.bench_in_product]
    out.append(f"test files importing bench/: {len(layering.tests_importing_bench)}")
    out.append(f"back arrows inside rollstream/: {len(layering.back_arrows)}")
    out += [
        f"  {a.path}:{a.line} -> {a.target} ({why}{', lazy' if a.lazy else ''})"
        for why, a in layering.back_arrows
    ]
    out.append(f"files over the limit: {len(layering.big_files)}")
    out += [f"  {path}: {n}" for path, n in layering.big_files]
    out.append(f"functions over {max_function} lines (outside tests): {layering.functions_over}; longest:")
    out += [f"  {f.path}:{f.line} {f.name}: {f.lines}" for f in layering.longest_functions]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--max-lines", type=int, default=400)
    parser.add_argument("--max-function", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="the whole scan as JSON")
    args = parser.parse_args(argv)
    layering = scan(args.root, args.max_lines, args.max_function)
    if args.json:
        print(json.dumps(asdict(layering), indent=1))
    else:
        print(summary(layering, args.max_function))
    return 0


if __name__ == "__main__":
    sys.exit(main())
