"""Operators and array methods (the dispatch of `_array.binary` / `getattr_` / `getitem` /
`_AtIndex._update`): every Python form of a typed value goes through the rule the runtime
uses for it (`_rules.binary`, `unary`, `dynamic_index_type`, `combine`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from mypy.plugin import AttributeContext, FunctionContext, MethodContext
from mypy.types import AnyType, Instance, TupleType, Type, get_proper_type

from .. import _rules, _surface
from .._rules import LITERAL, SpmdType
from .codes import apply, report, report_past_operator_fallback
from .config import CONFIG
from .convert import (
    SARRAY,
    STATIC,
    Known,
    alternatives,
    arrays_only,
    is_python_int,
    is_sarray,
    state_of_args,
    to_operand,
)

#: operator method -> (rule, reflected, the runtime's op label), from the surface table's
#: operator rows (`_surface.OPERATORS`: `__mod__` and its reflected `__rmod__`)
BINARY: Final = {
    **{r.name: (str(r.rule), False, f"operator {r.symbol}") for r in _surface.OPERATORS},
    **{r.reflected: (str(r.rule), True, f"operator {r.symbol}") for r in _surface.OPERATORS
       if r.reflected},
}
#: operators Python reflects by swapping (`2 < x` is `x.__gt__(2)`): a Python scalar on the left
#: reaches the typed value's own method, after mypy tried the scalar's
_SWAPPED: Final = frozenset(r.rule for r in _surface.OPERATORS if r.reflected is None)
#: unary operator / array method -> (rule, binding, the runtime's op label), from the surface
#: table (`_surface.UNARY_OPERATORS`, `_surface.METHODS`)
UNARY: Final = {
    **{r.name: (str(r.rule), r.binding, str(r.rule)) for r in _surface.UNARY_OPERATORS},
    **{r.name: (str(r.rule), r.binding, f".{r.name}()") for r in _surface.METHODS},
}
#: typed properties (`x.T`): (rule, binding, op label); `_surface.PROPERTIES` with a rule
PROPERTIES: Final = {r.name: (str(r.rule), r.binding, f".{r.name}") for r in _surface.PROPERTIES
                     if r.rule is not None}
#: `x.at[idx].<method>(v)`: the surface table's `.at[]` rows (`_rules.at_update_type` types them)
AT_METHODS: Final = {r.name: r.rule for r in _surface.AT}
AT_INDEX: Final = f"{STATIC}._AtIndex"
#: the rule of `x[i]` with static indices (a traced one: `_rules.dynamic_index_type`)
_STATIC_INDEX: Final = str(_surface.STATIC_INDEX.rule)

#: `0 == x`: Python's `int.__eq__` gives NotImplemented, then `x.__eq__(0)` runs (mypy would
#: type it `bool` through `int.__eq__(object)`)
SCALAR_COMPARISONS: Final = {f"builtins.{c}.{r.name}": f"scalar.{r.name}"
                             for c in ("int", "float", "bool", "complex")
                             for r in _surface.OPERATORS if r.name in ("__eq__", "__ne__")}
#: full name -> feature key of `analyze`
METHODS: Final = {**{f"{SARRAY}.{m}": m for m in (*BINARY, *UNARY, "__getitem__")},
                  **{f"{AT_INDEX}.{m}": f"at.{m}" for m in AT_METHODS}, **SCALAR_COMPARISONS}
ATTRIBUTES: Final = {f"{SARRAY}.{a}": a for a in PROPERTIES}
#: builtins that call a dunder (`abs(x)`: mypy's function hook, not `__abs__`'s method hook)
FUNCTIONS: Final = {r.jax: r.name for r in _surface.UNARY_OPERATORS if r.jax.startswith("builtins.")}


def analyze(ctx: MethodContext | AttributeContext | FunctionContext, feature: str) -> Type:
    """The result of operator / method / property `feature` of a typed value."""
    if isinstance(ctx, FunctionContext):
        return _builtin(ctx, *UNARY[feature])
    if isinstance(ctx, AttributeContext):
        return _unary(ctx, *PROPERTIES[feature])
    if feature in BINARY:
        return _binary(ctx, *BINARY[feature])
    if feature in UNARY:
        return _unary(ctx, *UNARY[feature])
    if feature == "__getitem__":
        return _getitem(ctx)
    if feature.startswith("scalar."):
        return _scalar_comparison(ctx, *BINARY[feature.partition(".")[2]])
    return _at(ctx, feature.partition(".")[2])


def _binary(ctx: MethodContext, name: str, reflected: bool, op: str) -> Type:
    default = ctx.default_return_type
    if not ctx.args or not ctx.args[0]:
        return default
    self_alts = alternatives(ctx.api, ctx.type, None)
    other_t = ctx.arg_types[0][0]
    other_alts = alternatives(ctx.api, other_t, ctx.args[0][0])
    if self_alts is None or other_alts is None:
        return default
    p = get_proper_type(other_t)
    # as `_array.binary`: an int exponent is `integer_pow` (a bool is not an int there)
    int_literal = not reflected and is_python_int(p)

    def fn(s: Known, o: Known) -> SpmdType:
        a, b = (o, s) if reflected else (s, o)
        return _rules.binary(name, a, b, CONFIG.features, op=op, int_literal=int_literal).type

    # `2.0 + u`, `2 < u`: mypy tried `float.__add__` / `int.__lt__` first and would report its
    # generic `[operator]` error instead of the rule's; `u == 0.0`: mypy would fall back to
    # `float.__eq__(object)` and type it `bool` silently. Report the rule's error past that.
    past = (reflected or name in _SWAPPED) and not is_sarray(other_t)
    on_error = report_past_operator_fallback if past else report
    return apply(ctx.api, ctx.context, default, [self_alts, other_alts], fn, on_error)


def _scalar_comparison(ctx: MethodContext, name: str, _reflected: bool, op: str) -> Type:
    """`0 == x` with a typed `x`: the runtime's `x == 0` (`_rules.binary(name, x, 0)`)."""
    default = ctx.default_return_type
    if not ctx.args or not ctx.args[0] or not is_sarray(ctx.arg_types[0][0]):
        return default
    alts = alternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if alts is None:
        return default
    return apply(ctx.api, ctx.context, default, [alts],
                 lambda x: _rules.binary(name, x, LITERAL, CONFIG.features, op=op).type)


def _unary_rule(name: str, binding: str, op: str) -> Callable[[SpmdType], SpmdType]:
    """The rule of a one-operand row: `unary`, or `mean_type` for the "mean" binding."""
    if binding == "mean":
        return lambda t: _rules.mean_type(t, CONFIG.features, op=op)
    return lambda t: _rules.unary(name, t, CONFIG.features, op=op)


def _unary(ctx: MethodContext | AttributeContext, name: str, binding: str, op: str) -> Type:
    default = ctx.default_return_type if isinstance(ctx, MethodContext) else ctx.default_attr_type
    alts = alternatives(ctx.api, ctx.type, None)
    if alts is None:
        return default
    return apply(ctx.api, ctx.context, default, [alts], _unary_rule(name, binding, op))


def _getitem(ctx: MethodContext) -> Type:
    """`x[idx]`, as `_array.getitem`: static indices are `getitem`; an array-valued index is a
    dynamic slice, typed by `_rules.dynamic_index_type` with the indices' states. A raw JAX
    index has a state the plugin cannot know: the value's own rule is still checked (an
    Unreduced value cannot be sliced dynamically), the result is unknown."""
    default = ctx.default_return_type
    idx = get_proper_type(ctx.arg_types[0][0]) if ctx.arg_types and ctx.arg_types[0] else None
    items = list(idx.items) if isinstance(idx, TupleType) else [idx] if idx is not None else []
    index_types: list[SpmdType] = []
    dynamic = raw_index = False
    for item in items:
        p = get_proper_type(item)
        if isinstance(p, AnyType):
            return default  # maybe an array: the rule is unknown
        if is_sarray(p):
            t = to_operand(p)
            if not isinstance(t, SpmdType):
                return default
            index_types.append(t)
            dynamic = True
        elif isinstance(p, Instance) and p.type.fullname == "jax._src.basearray.Array":
            raw_index = True
    alts = alternatives(ctx.api, ctx.type, None)
    if alts is None:
        return default
    if raw_index:
        apply(ctx.api, ctx.context, default, [alts],
              lambda t: _rules.dynamic_index_type(t, index_types, CONFIG.features, op="indexing"))
        return default
    if not dynamic:
        return apply(ctx.api, ctx.context, default, [alts],
                     lambda t: _rules.unary(_STATIC_INDEX, t, CONFIG.features, op="indexing"))
    return apply(ctx.api, ctx.context, default, [alts],
                 lambda t: _rules.dynamic_index_type(t, index_types, CONFIG.features, op="indexing"))


def _at(ctx: MethodContext, method: str) -> Type:
    """`x.at[idx].<method>(v)`: `_rules.at_update_type`, as at runtime."""
    default = ctx.default_return_type
    p = get_proper_type(ctx.type)
    x = state_of_args(p.args) if isinstance(p, Instance) else None
    if x is None or not ctx.args or not ctx.args[0]:
        return default
    values = alternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if values is None:
        return default
    op = f".at[].{method}()"

    def fn(v: Known) -> SpmdType:
        return _rules.at_update_type(method, x, v, CONFIG.features, op=op)

    return apply(ctx.api, ctx.context, default, [values], fn)


def _builtin(ctx: FunctionContext, name: str, binding: str, op: str) -> Type:
    """`abs(x)` (builtins.abs does not go through the `__abs__` method hook)."""
    if not ctx.arg_types or not ctx.arg_types[0]:
        return ctx.default_return_type
    alts = alternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if alts is None or LITERAL in alts:
        return ctx.default_return_type
    return apply(ctx.api, ctx.context, ctx.default_return_type, [arrays_only(alts)],
                 _unary_rule(name, binding, op))

