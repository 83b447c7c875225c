"""AST mutation operators (SWE-smith style) that inject one small bug into a function.

`find_mutations(source, path)` lists every candidate mutation of one module, in source
order; each is a set of byte-range text edits, so the mutant keeps the file's formatting
and comments and the gold patch is a minimal diff. Only code inside function bodies is
mutated (never module-level code, which runs at import time). `apply_mutation` applies
the edits and checks that the result parses and differs from the original AST.

Operators: flip_comparison (`<`→`<=`, `==`→`!=`, `in`→`not in`, ...), flip_boolean
(`and`↔`or`), remove_not, off_by_one (constant indexes, slice bounds, `range` stops),
change_constant (ints, True/False), swap_arguments (first two positional arguments),
swap_operands (`a - b` → `b - a`), change_operator (`+`↔`-`, `+=`↔`-=`),
remove_conditional and remove_early_return (delete an `if` block without `else`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

KINDS = (
    "flip_comparison",
    "flip_boolean",
    "remove_not",
    "off_by_one",
    "change_constant",
    "swap_arguments",
    "swap_operands",
    "change_operator",
    "remove_conditional",
    "remove_early_return",
)

_COMPARE_FLIPS: dict[type[ast.cmpop], tuple[str, str]] = {
    ast.Lt: ("<", "<="),
    ast.LtE: ("<=", "<"),
    ast.Gt: (">", ">="),
    ast.GtE: (">=", ">"),
    ast.Eq: ("==", "!="),
    ast.NotEq: ("!=", "=="),
    ast.Is: ("is", "is not"),
    ast.IsNot: ("is not", "is"),
    ast.In: ("in", "not in"),
    ast.NotIn: ("not in", "in"),
}  # operator type -> (its source text, the flipped text)
_OPERATOR_FLIPS: dict[type[ast.operator], tuple[str, str]] = {ast.Add: ("+", "-"), ast.Sub: ("-", "+")}
_NON_COMMUTATIVE = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod)
# Swapping these arguments only produces an obvious TypeError, never an interesting bug.
_NO_SWAP_CALLS = frozenset({"isinstance", "issubclass", "getattr", "setattr", "hasattr", "super", "print"})


class MutationError(ValueError):
    """A mutation whose edits do not produce valid, different code."""


@dataclass(frozen=True)
class Edit:
    start: int  # byte offsets into the UTF-8 source
    end: int
    text: str


@dataclass(frozen=True)
class Mutation:
    kind: str
    path: str  # file path relative to the repository root
    function: str  # qualified name, e.g. "Duration.__add__"
    function_line: int  # the code object's first line (first decorator, else `def`)
    line: int  # where the change is
    description: str
    edits: tuple[Edit, ...]

    @property
    def key(self) -> str:
        return f"{self.path}:{self.line}:{self.kind}:{self.edits[0].start}"


class _Source:
    """Byte offsets for (line, col) positions; ast columns are UTF-8 byte offsets."""

    def __init__(self, text: str) -> None:
        self.data = text.encode()
        self.line_starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.line_starts.append(self.line_starts[-1] + len(line))

    def start(self, node: ast.AST) -> int:
        return self.line_starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]

    def end(self, node: ast.AST) -> int:
        return self.line_starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]

    def text(self, start: int, end: int) -> str:
        return self.data[start:end].decode()

    def segment(self, node: ast.AST) -> str:
        return self.text(self.start(node), self.end(node))

    def whole_lines(self, node: ast.stmt) -> tuple[int, int] | None:
        """The byte range of the lines `node` spans, when nothing else shares them."""
        first = self.line_starts[node.lineno - 1]
        last_line_end = self.line_starts[min(node.end_lineno or node.lineno, len(self.line_starts) - 1)]
        before = self.text(first, self.start(node))
        after = self.text(self.end(node), last_line_end).strip()
        if before.strip() or (after and not after.startswith("#")):
            return None
        return first, last_line_end


def _is_atom(node: ast.expr) -> bool:
    return isinstance(node, ast.Name | ast.Attribute | ast.Call | ast.Subscript | ast.Constant)


def _int_constant(node: ast.expr) -> int | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


class _Finder(ast.NodeVisitor):
    def __init__(self, source: _Source, path: str) -> None:
        self.src = source
        self.path = path
        self.scope: list[str] = []
        self.functions: list[tuple[str, int]] = []  # (qualname, first line) of enclosing functions
        self.found: list[Mutation] = []

    # ------------------------------------------------------------ scopes
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        for stmt in node.body:
            self.visit(stmt)
        self.scope.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.scope.append(node.name)
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        self.functions.append((".".join(self.scope), first))
        self._statements(node.body)
        for stmt in node.body:
            self.visit(stmt)
        self.functions.pop()
        self.scope.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        return  # positions inside f-strings are unreliable before Python 3.12

    def visit_Lambda(self, node: ast.Lambda) -> None:
        return

    def generic_visit(self, node: ast.AST) -> None:
        if self.functions:
            for name in ("body", "orelse", "finalbody"):
                block = getattr(node, name, None)
                if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                    self._statements(block)
            handler = getattr(self, f"_mutate_{type(node).__name__}", None)
            if handler is not None:
                handler(node)
        super().generic_visit(node)

    def _add(self, kind: str, node: ast.AST, description: str, *edits: Edit) -> None:
        qualname, first = self.functions[-1]
        line = getattr(node, "lineno", first)
        self.found.append(Mutation(kind, self.path, qualname, first, line, description, tuple(edits)))

    def _replace_in_gap(self, kind: str, left: ast.AST, right: ast.AST, old: str, new: str) -> None:
        start, end = self.src.end(left), self.src.start(right)
        gap = self.src.text(start, end)
        pattern = re.escape(old).replace(r"\ ", r"\s+")
        if old[0].isalpha():
            pattern = rf"(?<![\w]){pattern}(?![\w])"
        matches = list(re.finditer(pattern, gap))
        if len(matches) != 1 or "#" in gap:
            return
        match = matches[0]
        edit = Edit(start + match.start(), start + match.end(), new)
        self._add(kind, right, f"`{old}` -> `{new}`", edit)

    # ------------------------------------------------------------ expressions
    def _mutate_Compare(self, node: ast.Compare) -> None:
        left: ast.expr = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            old, new = _COMPARE_FLIPS[type(op)]
            self._replace_in_gap("flip_comparison", left, right, old, new)
            left = right

    def _mutate_BoolOp(self, node: ast.BoolOp) -> None:
        old, new = ("and", "or") if isinstance(node.op, ast.And) else ("or", "and")
        self._replace_in_gap("flip_boolean", node.values[0], node.values[1], old, new)

    def _mutate_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not):
            edit = Edit(self.src.start(node), self.src.start(node.operand), "")
            if self.src.text(edit.start, edit.end).strip() == "not":
                self._add("remove_not", node, "removed `not`", edit)

    def _mutate_BinOp(self, node: ast.BinOp) -> None:
        flip = _OPERATOR_FLIPS.get(type(node.op))
        if flip and not isinstance(node.left, ast.Constant | ast.JoinedStr):
            self._replace_in_gap("change_operator", node.left, node.right, *flip)
        if isinstance(node.op, _NON_COMMUTATIVE) and not isinstance(node.left, ast.JoinedStr):
            left, right = self.src.segment(node.left), self.src.segment(node.right)
            if left != right and _is_atom(node.left) and _is_atom(node.right):
                self._swap("swap_operands", node, node.left, node.right, f"`{left}` <-> `{right}`")

    def _mutate_AugAssign(self, node: ast.AugAssign) -> None:
        flip = _OPERATOR_FLIPS.get(type(node.op))
        if flip:
            self._replace_in_gap("change_operator", node.target, node.value, flip[0] + "=", flip[1] + "=")

    def _swap(self, kind: str, node: ast.AST, first: ast.expr, second: ast.expr, description: str) -> None:
        a, b = self.src.segment(first), self.src.segment(second)
        self._add(
            kind,
            node,
            description,
            Edit(self.src.start(first), self.src.end(first), b),
            Edit(self.src.start(second), self.src.end(second), a),
        )

    def _mutate_Call(self, node: ast.Call) -> None:
        name = node.func.id if isinstance(node.func, ast.Name) else ""
        args = node.args
        if name == "range" and args and not any(isinstance(a, ast.Starred) for a in args):
            self._off_by_one(args[0] if len(args) == 1 else args[1], prefer="-")
        if name in _NO_SWAP_CALLS or len(args) < 2 or any(isinstance(a, ast.Starred) for a in args[:2]):
            return
        if self.src.segment(args[0]) != self.src.segment(args[1]) and args[0].lineno == args[1].lineno:
            self._swap(
                "swap_arguments",
                node,
                args[0],
                args[1],
                f"swapped arguments of `{self.src.segment(node.func)}(...)`",
            )

    def _mutate_Subscript(self, node: ast.Subscript) -> None:
        index = node.slice
        if isinstance(index, ast.Slice):
            for bound in (index.lower, index.upper):
                if bound is not None and (_int_constant(bound) is not None or _plus_minus_one(bound)):
                    self._off_by_one(bound, prefer="+")
        elif _int_constant(index) is not None or _plus_minus_one(index) or _negative_int(index):
            self._off_by_one(index, prefer="+")

    def _off_by_one(self, node: ast.expr, prefer: str) -> None:
        text = self.src.segment(node)
        value = _int_constant(node)
        if value is not None:
            new = str(value + 1 if prefer == "+" or value == 0 else value - 1)
        elif _negative_int(node):
            new = str(-(node.operand.value + 1))  # type: ignore[attr-defined]
        elif _plus_minus_one(node):
            new = self.src.segment(node.left)  # type: ignore[attr-defined]
        else:
            new = f"{text} {prefer} 1" if _is_atom(node) else f"({text}) {prefer} 1"
        edit = Edit(self.src.start(node), self.src.end(node), new)
        self._add("off_by_one", node, f"`{text}` -> `{new}`", edit)

    def _mutate_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool):
            new = repr(not value)
        elif type(value) is int:
            new = str(value + 1 if value in (0, 1) else value - 1)
        else:
            return
        old = self.src.segment(node)
        if old != repr(value) and not isinstance(value, bool):
            return  # hex, underscores: leave the author's spelling alone
        self._add(
            "change_constant",
            node,
            f"`{old}` -> `{new}`",
            Edit(self.src.start(node), self.src.end(node), new),
        )

    # ------------------------------------------------------------ statements
    def _statements(self, block: list[ast.stmt]) -> None:
        if len(block) < 2:
            return  # deleting the only statement would leave an empty block
        for stmt in block:
            if not isinstance(stmt, ast.If) or stmt.orelse:
                continue
            span = self.src.whole_lines(stmt)
            if span is None:
                continue
            condition = self.src.segment(stmt.test)
            exits = isinstance(stmt.body[-1], ast.Return | ast.Raise | ast.Continue | ast.Break)
            kind = "remove_early_return" if exits else "remove_conditional"
            self._add(kind, stmt, f"removed `if {condition}:` block", Edit(span[0], span[1], ""))


def _plus_minus_one(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Add | ast.Sub)
        and _int_constant(node.right) == 1
    )


def _negative_int(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and _int_constant(node.operand) is not None
    )


def find_mutations(source: str, path: str) -> list[Mutation]:
    """Every candidate mutation in `source`, in source order (raises SyntaxError on bad input)."""
    tree = ast.parse(source)
    finder = _Finder(_Source(source), path)
    finder.visit(tree)
    return sorted(finder.found, key=lambda m: (m.edits[0].start, KINDS.index(m.kind)))


def apply_mutation(source: str, mutation: Mutation) -> str:
    """The mutated source; `MutationError` when it does not parse or equals the original."""
    data = source.encode()
    for edit in sorted(mutation.edits, key=lambda e: e.start, reverse=True):
        data = data[: edit.start] + edit.text.encode() + data[edit.end :]
    mutated = data.decode()
    try:
        new_tree = ast.dump(ast.parse(mutated))
    except SyntaxError as error:
        raise MutationError(f"{mutation.key}: mutant does not parse ({error.msg})") from None
    if new_tree == ast.dump(ast.parse(source)):
        raise MutationError(f"{mutation.key}: mutant is the same program")
    return mutated


def normalized_ast(source: str) -> str:
    """A formatting-independent fingerprint of a module, for deduplicating mutants."""
    return ast.dump(ast.parse(source), annotate_fields=False, include_attributes=False)
