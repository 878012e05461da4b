"""The typed values' memo of their own typing (issue 27, item 6: the typed values' cost).

An operator, a one-array call (`st.numpy` / `st.nn` functions and methods), an n-operand op
and a collective of one typed value read only a few facts to type their result: the operands'
state classes (their four-state types), refinements and local shapes, a literal operand's type
and value, the call's static arguments, the codes `st.allow` opts out of and whether JAX's
states are off (`check_vma=False`). A repeated layer meets the same op with the same facts:
its key here (`operands_key`, `nary_key`, `call_key`; the collectives' `_ops.collectives`
builds its own with the mesh's axes) names those facts, and the op binds JAX and compares
JAX's state with the kept one without running the rules again (`_typed.array`).

A key is None (the op is typed afresh) for anything else: a raw JAX operand (its state is
read from JAX at each call), a NumPy array, `st.axis_size`'s numbers (an `int` / `float`
subclass carrying an axis for the refinement), an argument that is not a Python number,
string, None, dtype or a tuple of them. A rule that raises is never kept (it raises again);
`tests/test_typed_memo.py` holds served results equal to computed ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import allowed_codes
from .hints import STATE_META, is_state_class

#: `_typed.array.binary`'s typing of an operator: `(rule's result, refinement)`
BINARY: dict[tuple[Any, ...], Any] = {}
#: `_typed.array.nary`'s: `(rule's result, refinement, result shape)`
NARY: dict[tuple[Any, ...], Any] = {}
#: `_typed.array.call_op`'s: `(result state, rule row, refinement)`
CALLS: dict[tuple[Any, ...], Any] = {}
#: `_ops.collectives`' typing of a collective of one typed value: `(JAX's axis argument,
#: result state, refinement)`, keyed there (its key reads the mesh)
COLLECTIVES: dict[tuple[Any, ...], Any] = {}
#: `_typed.refining._refined`'s: the refinement rules' results by everything they read
REFINEMENTS: dict[tuple[Any, ...], Any] = {}

#: entries a memo holds before it is emptied
SIZE = 4096

#: Python numbers an op takes as a literal operand (exact types: `st.axis_size`'s `int` and
#: `float` subclasses are never keyed)
LITERALS = frozenset({int, float, bool, complex})
#: argument types a key takes as they are (exact types; tuples of them, and dtypes, too)
STATIC_ARGUMENTS = frozenset({int, float, bool, complex, str, type(None)})


def keep(memo: dict[tuple[Any, ...], Any], key: tuple[Any, ...], value: Any) -> None:
    """Keep `value` under `key`, emptying `memo` first when it is full."""
    if len(memo) >= SIZE:
        memo.clear()
    memo[key] = value


def clear() -> None:
    """Empty every memo of this module."""
    for memo in (BINARY, NARY, CALLS, COLLECTIVES, REFINEMENTS):
        memo.clear()


def static(v: Any) -> bool:
    """Whether the argument `v` can be part of a key as it is."""
    t = type(v)
    # a dtype: np.dtype("float32") (of a subclass of np.dtype), jnp.float32 or float (classes)
    if t in STATIC_ARGUMENTS or isinstance(v, (type, np.dtype)):
        return True
    return t is tuple and all(static(e) for e in v)


def operands_key(head: tuple[Any, ...], operands: tuple[Any, ...] | list[Any],
                 vma_off: int) -> tuple[Any, ...] | None:
    """What typing an op on `operands` reads: `head` (the rule, the op's name, ...), each
    operand's state class, refinement and local shape (a literal: its type and value), the
    codes `st.allow` opts out of and `vma_off` (inside `check_vma=False` bodies)."""
    parts: list[Any] = [*head, allowed_codes(), vma_off]
    for x in operands:
        cls = type(x)
        if isinstance(cls, STATE_META):
            raw = x.raw
            try:   # (a tracer's `shape` is a property reading its `aval`'s)
                shape = raw.aval.shape
            except AttributeError:
                shape = getattr(raw, "shape", None)
            if shape is None:  # (a typed Python number: `st.wrap(1.0)`)
                return None
            parts += (cls, x.refinement, shape)
        elif cls in LITERALS:
            parts += (cls, x, None)
        else:
            return None
    return tuple(parts)


def nary_key(rule: str | Callable[..., Any], name: str, op: str, kind: str,
             params: dict[str, Any], args: list[Any], vma_off: int) -> tuple[Any, ...] | None:
    """`operands_key` of an n-operand op: the rule (a rule given as a function of the types,
    `where`'s, by `name`), the refinement kind and its parameters (each with its type)."""
    if not all(static(v) for v in params.values()):
        return None
    return operands_key((rule if isinstance(rule, str) else ("function", name), name, op, kind,
                         tuple((k, type(v), v) for k, v in params.items())), args, vma_off)


def call_key(rule: str, x: Any, jfn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], op: str, refine: str, vma_off: int
             ) -> tuple[Any, ...] | None:
    """What typing `jfn(x, *args, **kwargs)` reads (`_typed.array.call_op`): the rule, the op's
    name, the function, the refinement kind, `x`'s state class, refinement, local shape and
    dtype, the arguments (each with its type: `1`, `1.0` and `True` are equal keys but not
    equal calls), the `st.allow` codes and `vma_off`. None unless `x` is a typed value."""
    cls = type(x)
    if not is_state_class(cls) or not all(static(a) for a in args) \
            or not all(static(v) for v in kwargs.values()):
        return None
    raw = x.raw
    shape, dtype = getattr(raw, "shape", None), getattr(raw, "dtype", None)
    if shape is None or dtype is None:  # (a typed Python number: `st.wrap(1.0)`)
        return None
    return (rule, op, jfn, refine, cls, x.refinement, shape, dtype,
            tuple((type(a), a) for a in args), tuple((k, type(v), v) for k, v in kwargs.items()),
            allowed_codes(), vma_off)
