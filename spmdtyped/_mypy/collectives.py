"""Collectives and casts: `st.psum`, `pmean`, `pmax`, `pmin`, `ppermute`, `pshuffle`,
`pbroadcast`, `all_gather`, `psum_scatter`, `all_to_all`, `pvary`, `pcast`, `axis_index`:
the operand's state through `_rules.axis_op` (leaf by leaf of a tuple pytree)."""

from __future__ import annotations

from typing import Final

from mypy.nodes import Expression
from mypy.plugin import FunctionContext
from mypy.types import TupleType, Type, get_proper_type

from .. import _rules, _surface
from .._errors import SpmdTypeError
from .._rules import SpmdType
from .codes import AXIS, apply, report
from .config import CONFIG
from .convert import STATIC, alternatives, any_type, arg, arrays_only, axis_value, from_spmd, literal_value

#: the collectives and casts with a typed result: the surface table's (`_surface.COLLECTIVES`;
#: `st.axis_size` is a Python int)
NAMES: Final = tuple(c.name for c in _surface.COLLECTIVES if c.ops or c.name == "axis_index")
#: full name -> collective
FULLNAMES: Final = {f"{m}.{n}": n for m in (STATIC, "spmdtyped", "spmdtyped._collectives")
                    for n in NAMES}


def analyze(ctx: FunctionContext, name: str) -> Type:
    """`st.<name>(x, axis_name, ...)`: the result state, or the rule's error."""
    op = f"st.{name}"
    default = ctx.default_return_type
    axis = arg(ctx, "axis_name")
    if axis is None:
        return default
    value = axis_value(*axis)
    if value is None or (isinstance(value, tuple) and None in value):
        # only when enabled: a reported error makes mypy try the next overload
        if AXIS in getattr(ctx.api.options, "enabled_error_codes", ()):
            ctx.api.fail(f"{op}: axis_name is not a literal str or tuple of str; the result "
                         f"state is unknown", ctx.context, code=AXIS)
        return default
    try:
        axes = _rules.normalize_axes(value, op)
        if name == "axis_index":
            return from_spmd(ctx.api, _rules.axis_index_type(axes))
        collective = _surface.collective(name)
        assert collective is not None, name
        to = arg(ctx, "to") if collective.select else None
        to_value = "varying" if to is None else literal_value(to[1])
        if to_value is None:
            return default
        rule = collective.op(to_value, op)
    except SpmdTypeError as err:
        report(ctx.api, err, ctx.context)
        return default
    x = arg(ctx, "x")
    if x is None:
        return default
    return _result(ctx, rule, op, axes, x[0], x[1], default)


def _result(ctx: FunctionContext, rule: str, op: str, axes: tuple[str, ...],
            expr: Expression | None, t: Type, default: Type) -> Type:
    p = get_proper_type(t)
    if isinstance(p, TupleType):  # a pytree: each leaf separately
        return p.copy_modified(items=[_result(ctx, rule, op, axes, None, i, any_type())
                                      for i in p.items])
    alts = alternatives(ctx.api, t, expr)
    if alts is None:
        return default

    def rule_fn(x: SpmdType) -> SpmdType:
        return _rules.axis_op(rule, x, axes, CONFIG.features, op=op)

    return apply(ctx.api, ctx.context, default, [arrays_only(alts)], rule_fn)
