"""Rules that depend on an op's other arguments (`_rules.arguments`): the keywords and
secondary arrays of `st.numpy.pad(x, 1, constant_values=...)`, `x.astype(jnp.int32)`,
`st.numpy.roll(x, shift)`, `st.nn.softmax(x, where=mask)`, ... read from source.

Keyword values are read when they are literals (numbers, strings, None, tuples of them, dtype
names such as `jnp.int32`, `np.int32`, `"int32"`, `int`, `bool`, `jnp.bool_`); anything else is
`_rules.UNKNOWN`, and where the rule needs it the result is the declared type (no claim, no
error). Statically the input's dtype is unknown: the rules assume `_rules.STATIC_DTYPE` (float).
"""

from __future__ import annotations

from typing import Any

from mypy.nodes import (
    ComplexExpr,
    Expression,
    FloatExpr,
    IntExpr,
    ListExpr,
    NameExpr,
    RefExpr,
    StrExpr,
    TupleExpr,
    UnaryExpr,
)
from mypy.types import Type

from .. import _rules
from .._rules import LITERAL, SpmdType
from .codes import apply
from .config import CONFIG
from .convert import alternatives, arrays_only, to_operand

#: dtype spellings -> NumPy names (JAX's defaults: 32 bits)
_DTYPE_NAMES = {"builtins.int": "int32", "builtins.float": "float32", "builtins.bool": "bool",
                "builtins.complex": "complex64"}
_DTYPE_MODULES = ("jax.numpy.", "numpy.", "spmdtyped.numpy.", "jax._src.numpy.scalar_types.",
                  "jax._src.numpy.lax_numpy.")


def literal(expr: Expression) -> object:
    """The Python value of a literal expression, a dtype name, or `_rules.UNKNOWN`."""
    if isinstance(expr, (IntExpr, FloatExpr, ComplexExpr, StrExpr)):
        return expr.value
    if isinstance(expr, NameExpr) and expr.fullname in ("builtins.None", "builtins.True",
                                                         "builtins.False"):
        return {"builtins.None": None, "builtins.True": True, "builtins.False": False}[expr.fullname]
    if isinstance(expr, UnaryExpr) and expr.op == "-":
        v = literal(expr.expr)
        return -v if isinstance(v, (int, float, complex)) and not isinstance(v, bool) else _rules.UNKNOWN
    if isinstance(expr, (TupleExpr, ListExpr)):
        items = [literal(i) for i in expr.items]
        return _rules.UNKNOWN if any(i is _rules.UNKNOWN for i in items) else tuple(items)
    if isinstance(expr, RefExpr) and expr.fullname:
        if expr.fullname in _DTYPE_NAMES:
            return _DTYPE_NAMES[expr.fullname]
        for m in _DTYPE_MODULES:
            if expr.fullname.startswith(m):
                return expr.fullname.removeprefix(m)
    return _rules.UNKNOWN


def call_arguments(ctx: Any) -> tuple[list[tuple[Expression, Type]], dict[str, tuple[Expression, Type]]]:
    """(positional, keyword) arguments as written at the call, whatever the callee's formals."""
    pos: list[tuple[Expression, Type]] = []
    kw: dict[str, tuple[Expression, Type]] = {}
    for kinds, names, exprs, types in zip(ctx.arg_kinds, ctx.arg_names, ctx.args, ctx.arg_types,
                                          strict=True):
        for kind, name, expr, t in zip(kinds, names, exprs, types, strict=True):
            if kind.is_positional() and not kind.is_star():
                pos.append((expr, t))
            elif name is not None and kind.is_named():
                kw[name] = (expr, t)
    return pos, kw


def typed_call(ctx: Any, rule: str, array: tuple[Expression | None, Type],
               rest: list[tuple[Expression, Type]], kw: dict[str, tuple[Expression, Type]],
               op: str, default: Type) -> Type:
    """`rule` on `array` with the other arguments: `_rules.call_type`, as the runtime's
    `_array.call_op`."""
    named = dict(zip(_rules.POSITIONAL.get(rule, ()), rest, strict=False))
    named.update(kw)
    keywords = {k: literal(e) for k, (e, _t) in named.items()}
    secondary: list[tuple[str, SpmdType]] = []
    for n in _rules.SECONDARY.get(rule, ()):
        if n not in named or keywords.get(n) is None:
            continue
        o = to_operand(named[n][1])
        if o is LITERAL:
            continue
        if not isinstance(o, SpmdType):
            return default  # a raw array: its state is unknown statically
        secondary.append((n, o))
    if _rules.argument_rule(rule, keywords, _rules.STATIC_DTYPE) is None:
        return default
    alts = alternatives(ctx.api, array[1], array[0])
    if alts is None:
        return default

    def fn(t: SpmdType) -> SpmdType:
        out = _rules.call_type(rule, t, keywords, _rules.STATIC_DTYPE, secondary, CONFIG.features,
                               op=op)
        assert out is not None
        return out

    return apply(ctx.api, ctx.context, default, [arrays_only(alts)], fn)


def has_arguments(rule: str) -> bool:
    """Whether the rule of `rule` depends on other arguments than the array."""
    return rule in _rules.POSITIONAL or rule in _rules.SECONDARY


#: arguments that choose no rule row and join no state (the refinement reads them)
_SHAPE_ONLY = frozenset({"axis", "keepdims"})


def passes_arguments(ctx: Any, rule: str, *, skip: int = 0) -> bool:
    """Whether this call of `rule` passes an argument its rule depends on (beyond `axis` and
    `keepdims`); `skip`: leading positional arguments that are the operands."""
    if not has_arguments(rule):
        return False
    pos, kw = call_arguments(ctx)
    named = set(_rules.named_arguments(rule, [e for e, _ in pos[skip:]], kw))
    return not named <= _SHAPE_ONLY

