"""Each mutation operator on small code: the exact edit, formatting kept, nothing at module level."""

from __future__ import annotations

import textwrap

import pytest

from sandboxes.tasks.mutators import (
    KINDS,
    Edit,
    Mutation,
    MutationError,
    apply_mutation,
    find_mutations,
    normalized_ast,
)

SOURCE = textwrap.dedent(
    '''\
    LIMIT = 10  # module level: never mutated
    if LIMIT > 3:
        LIMIT = 3


    class Box:
        @staticmethod
        def pick(items, index, flag):
            """Docstring stays."""
            if not items:
                return None
            if flag and index < len(items):  # keep this comment
                log("picked", index)
            total = index - 1
            total += 2
            for i in range(len(items)):
                total = total + items[i]
            return items[0], items[1:], total == 5, f"{index < 2}"
    '''
)


def mutants(kind: str) -> list[str]:
    """The changed line of each mutant of `kind`."""
    out = []
    for mutation in find_mutations(SOURCE, "box.py"):
        if mutation.kind != kind:
            continue
        mutated = apply_mutation(SOURCE, mutation)
        changed = [b for a, b in zip(SOURCE.splitlines(), mutated.splitlines(), strict=False) if a != b]
        out.append(changed[0].strip() if changed else mutated)
    return out


def test_every_kind_is_found_and_only_inside_functions() -> None:
    found = find_mutations(SOURCE, "box.py")
    assert {m.kind for m in found} == set(KINDS)
    assert all(m.line >= 8 for m in found), "module-level code must not be mutated"
    assert {m.function for m in found} == {"Box.pick"}
    assert {m.function_line for m in found} == {7}  # the decorator line: the code object's first line


def test_flip_comparison() -> None:
    lines = mutants("flip_comparison")
    assert "if flag and index <= len(items):  # keep this comment" in lines
    assert 'return items[0], items[1:], total != 5, f"{index < 2}"' in lines
    assert not any("{index <= 2}" in line for line in lines), "f-strings are left alone"


def test_flip_boolean_and_remove_not() -> None:
    assert mutants("flip_boolean") == ["if flag or index < len(items):  # keep this comment"]
    assert mutants("remove_not") == ["if items:"]


def test_off_by_one() -> None:
    lines = set(mutants("off_by_one"))
    assert "for i in range(len(items) - 1):" in lines
    assert 'return items[1], items[1:], total == 5, f"{index < 2}"' in lines
    assert 'return items[0], items[2:], total == 5, f"{index < 2}"' in lines


def test_change_constant_operator_and_operands() -> None:
    assert {"total = index - 2", "total += 1"} <= set(mutants("change_constant"))
    operators = set(mutants("change_operator"))
    assert {"total = index + 1", "total -= 2", "total = total - items[i]"} <= operators
    assert mutants("swap_operands") == ["total = 1 - index"]
    assert mutants("swap_arguments") == ['log(index, "picked")']


def test_remove_conditional_and_early_return_delete_whole_blocks() -> None:
    found = {m.kind: m for m in find_mutations(SOURCE, "box.py")}
    early = apply_mutation(SOURCE, found["remove_early_return"])
    assert "if not items:" not in early and "return None" not in early
    assert '"""Docstring stays."""' in early
    conditional = apply_mutation(SOURCE, found["remove_conditional"])
    assert "log(" not in conditional and "if flag" not in conditional
    compile(early, "box.py", "exec")
    compile(conditional, "box.py", "exec")


def test_only_statement_of_a_block_is_not_deleted() -> None:
    source = "def f(x):\n    if x:\n        return 1\n"
    assert not [m for m in find_mutations(source, "f.py") if m.kind.startswith("remove_")]


def test_unicode_before_the_edit_keeps_offsets_right() -> None:
    source = 'def f(x):\n    s = "héllo wörld"; return x < 3\n'
    (mutation,) = [m for m in find_mutations(source, "f.py") if m.kind == "flip_comparison"]
    assert apply_mutation(source, mutation) == 'def f(x):\n    s = "héllo wörld"; return x <= 3\n'


def test_invalid_or_identical_mutants_are_refused() -> None:
    source = "def f(x):\n    return x\n"
    broken = Mutation("flip_comparison", "f.py", "f", 1, 2, "", (Edit(21, 22, "(("),))
    with pytest.raises(MutationError, match="does not parse"):
        apply_mutation(source, broken)
    same = Mutation("flip_comparison", "f.py", "f", 1, 2, "", (Edit(21, 22, "x"),))
    with pytest.raises(MutationError, match="same program"):
        apply_mutation(source, same)


def test_normalized_ast_ignores_formatting() -> None:
    assert normalized_ast("def f(x):\n    return x+1  # c\n") == normalized_ast(
        "def f(x):\n    return (x + 1)\n"
    )
    assert normalized_ast("x = 1\n") != normalized_ast("x = 2\n")


def test_mutations_are_deterministic() -> None:
    assert find_mutations(SOURCE, "box.py") == find_mutations(SOURCE, "box.py")
