"""Lowered program identity: an example's typed program and its hand-written raw twin lower to
the same StableHLO, up to names.

`lowered.as_text(debug_info=False)` drops locations and debug names; what is left that
depends on Python names is the module name (`@jit_<function name>`) and the symbols of the
functions in the module (`@main`, `@_where`, `@closed_call`, ...). `normalize` renames the
module to `@jit_program` and every function symbol to `@fN` in order of definition, so two
programs are equal exactly when they compute the same thing with the same ops.

Used by `benchmarks/run.py` (row 1) and `tests/test_lowering_identity.py`.
"""

from __future__ import annotations

import difflib
import re
from typing import Any

_MODULE = re.compile(r"^module @[^\s]+", re.MULTILINE)
_FUNC_DEF = re.compile(r"\bfunc\.func\s+(?:public\s+|private\s+|nested\s+)?@([\w$.\-]+)")


def normalize(text: str) -> str:
    """StableHLO text with the name-dependent parts renamed (see the module docstring)."""
    text = _MODULE.sub("module @jit_program", text, count=1)
    names: dict[str, str] = {}
    for m in _FUNC_DEF.finditer(text):
        names.setdefault(m.group(1), f"f{len(names)}")
    if names:
        symbol = re.compile(r"@(" + "|".join(re.escape(n) for n in
                                             sorted(names, key=len, reverse=True)) + r")\b")
        text = symbol.sub(lambda m: "@" + names[m.group(1)], text)
    return text


def lowered_text(jitted: Any, *args: Any) -> str:
    """The normalized StableHLO of `jitted.lower(*args)`, without debug info."""
    return normalize(jitted.lower(*args).as_text(debug_info=False))


def compare_example(module: Any) -> tuple[bool, str]:
    """(identical, unified diff) of the typed and raw programs of an example module."""
    mesh = module.make_mesh()
    args = module.make_inputs(mesh)
    typed, raw = module.programs(mesh)
    a, b = lowered_text(typed, *args), lowered_text(raw, *args)
    if a == b:
        return True, ""
    diff = "\n".join(difflib.unified_diff(b.splitlines(), a.splitlines(), "raw", "typed",
                                          lineterm="", n=1))
    return False, diff
