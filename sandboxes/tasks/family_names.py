"""Identifiers of the learning family's tasks: every task renames its functions and parameters.

The modules of `family_modules` share a few expression shapes (a product, a `<=`, a
`max`, an `==`, a difference), so what tells one task from another is mostly names.
With fixed names a policy can learn "function `larger_account` wants the `min_max`
fix" on the train split, which scores there and is worthless on held-out libraries
(seen: train reward kept rising while held-out pass@1 fell below blind guessing). Each
task therefore draws fresh names from its split's word pool (disjoint pools for train
and held-out), so the only thing that carries across tasks is the line the test output
shows and the telltale on it. Pure: the names follow from the rng the caller seeds.
"""

from __future__ import annotations

import builtins
import keyword
import random
import re
from collections.abc import Callable

from sandboxes.tasks.family_modules import Function

_TRAIN_WORDS = (
    "amber",
    "basil",
    "cedar",
    "ember",
    "fable",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kernel",
    "lantern",
    "meadow",
    "nectar",
    "orbit",
    "pebble",
    "quartz",
    "raven",
    "saffron",
    "tundra",
    "umber",
    "velvet",
    "willow",
    "yarrow",
    "zephyr",
    "acorn",
    "birch",
    "cobalt",
    "dune",
    "fern",
    "glacier",
    "hazel",
    "iris",
    "jasper",
    "kelp",
    "lotus",
    "maple",
    "nimbus",
    "opal",
    "pine",
    "quill",
    "reef",
    "sable",
    "thistle",
    "vale",
    "wren",
    "cinder",
    "drift",
    "marble",
)
_HELDOUT_WORDS = (
    "arrow",
    "bramble",
    "crest",
    "dapple",
    "echo",
    "flint",
    "grove",
    "heron",
    "islet",
    "jetty",
    "knoll",
    "lichen",
    "marsh",
    "nook",
    "ochre",
    "prism",
    "ridge",
    "spruce",
    "thorn",
    "upland",
    "vortex",
    "wharf",
    "yonder",
    "zinc",
    "bluff",
    "cove",
    "fjord",
    "gale",
    "hollow",
    "ivy",
)
# a word holding a bug's telltale or fix text would make a fix touch another line
_FORBIDDEN = ("min", "max", "not")


def _usable(word: str) -> bool:
    reserved = keyword.iskeyword(word) or hasattr(builtins, word)
    return word.isidentifier() and not reserved and not any(f in word for f in _FORBIDDEN)


WORDS: dict[str, tuple[str, ...]] = {
    "train": tuple(w for w in _TRAIN_WORDS if _usable(w)),
    "heldout": tuple(w for w in _HELDOUT_WORDS if _usable(w)),
}


def renamed(functions: list[Function], split: str, rng: random.Random) -> list[Function]:
    """`functions` (one library, in order) with fresh distinct function names and, in each,
    fresh distinct parameter names substituted in its expression."""
    words = WORDS[split]
    names: set[str] = set()
    out = []
    for function in functions:
        name = _fresh(lambda: "_".join(rng.sample(words, 2)), names)
        params = [p.strip() for p in function.params.split(",")]
        new_params: set[str] = set()
        mapping = {old: _fresh(lambda: rng.choice(words), new_params) for old in params}
        expr = _substituted(function.expr, mapping)
        out.append(Function(name, ", ".join(mapping[p] for p in params), expr, function.cases))
    return out


def _substituted(expr: str, mapping: dict[str, str]) -> str:
    """`expr` with each whole identifier in `mapping` replaced (builtins such as `max` stay)."""
    return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: mapping.get(m.group(0), m.group(0)), expr)


def _fresh(draw: Callable[[], str], taken: set[str]) -> str:
    while (value := draw()) in taken:
        pass
    taken.add(value)
    return value
