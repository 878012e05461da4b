"""Operators and array methods (the dispatch of `_array.binary` / `getattr_` / `getitem` /
`_AtIndex._update`): every Python form of a typed value goes through the rule the runtime
uses for it (`_rules.binary`, `unary`, `dynamic_index_type`, `combine`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from mypy.nodes import (
    CallExpr,
    Expression,
    IndexExpr,
    MemberExpr,
    NameExpr,
    OpExpr,
    RefExpr,
    TempNode,
    TupleExpr,
)
from mypy.plugin import AttributeContext, FunctionContext, MethodContext
from mypy.types import AnyType, Instance, TupleType, Type, get_proper_type

from .. import _rules, _surface
from .._errors import SpmdTypeError
from .._rules import LITERAL, SpmdType
from .._rules.refine import ZERO_FLOWS, Refinement
from . import extents, refined
from .arguments import call_arguments, passes_arguments, typed_call
from .codes import apply, report, report_past_operator_fallback
from .config import CONFIG
from .convert import (
    SARRAY,
    STATIC,
    Known,
    alternatives,
    from_spmd,
    is_python_int,
    is_sarray,
    is_scalar,
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


def _plain(p: Any) -> Known | None:
    """The state of an unrefined typed value (or LITERAL for a Python scalar), else None: the
    operands whose result needs no `_refine` rule (the hooks' common case)."""
    if isinstance(p, Instance) and p.type.fullname == SARRAY:
        if len(p.args) == 4 and not isinstance(p.args[3], AnyType):
            return None
        return state_of_args(p.args)
    return LITERAL if is_scalar(p) else None


def _binary(ctx: MethodContext, name: str, reflected: bool, op: str) -> Type:
    default = ctx.default_return_type
    if not ctx.args or not ctx.args[0]:
        return default
    other_t = ctx.arg_types[0][0]
    p = get_proper_type(other_t)
    # `st.axis_size(a)` (`AxisSize[A]`) and `1 / st.axis_size(a)` (`AxisShare[A]`): Python
    # numbers to the four-state rule; `b / n` of a replicated `b` is a share (`refined.scale`)
    scale_name = p.type.fullname if isinstance(p, Instance) and p.type.fullname in refined.SCALES else None
    scale_type = scale_name is not None
    # as `_array.binary`: an int exponent is `integer_pow` (a bool is not an int there)
    int_literal = not reflected and (is_python_int(p) or scale_name == refined.AXIS_SIZE)
    # `2.0 + u`, `2 < u`: mypy tried `float.__add__` / `int.__lt__` first and would report its
    # generic `[operator]` error instead of the rule's; `u == 0.0`: mypy would fall back to
    # `float.__eq__(object)` and type it `bool` silently. Report the rule's error past that.
    past = (reflected or name in _SWAPPED) and not is_sarray(other_t)
    on_error = report_past_operator_fallback if past else report
    s, o = _plain(get_proper_type(ctx.type)), LITERAL if scale_type else _plain(p)
    scale = refined.scale(p) if isinstance(p, Instance) and scale_type else None
    other_e = ctx.args[0][0]
    if isinstance(other_e, TempNode) and isinstance(ctx.context, OpExpr):
        # `jnp.ones(4) + x`: mypy checks the reflected method on a stand-in for the left
        # operand; the constant is the source's
        other_e = ctx.context.left if reflected else ctx.context.right
    # a literal `0` / `0.0` operand is a zero (`refined.ralternatives`), which the rule's
    # refinement reads (`ZERO_FLOWS`: `0.0 * b` is zero, as at runtime)
    zero = refined.is_zero(other_e) and name in ZERO_FLOWS
    if s is not None and o is not None and scale is None and not zero:
        # no refinement: the four-state rule alone (`rapply`'s)
        try:
            out = _rules.binary(name, *((o, s) if reflected else (s, o)), CONFIG.features, op=op,
                                int_literal=int_literal).type
        except SpmdTypeError as err:
            on_error(ctx.api, err, ctx.context)
            return default
        return from_spmd(ctx.api, out)
    self_alts = refined.ralternatives(ctx.api, ctx.type, None)
    other_alts = [refined.Val(LITERAL, rank=0)] if scale_type \
        else refined.ralternatives(ctx.api, other_t, other_e)
    if self_alts is None or other_alts is None:
        return default

    def fn(s: Known, o: Known) -> SpmdType:
        a, b = (o, s) if reflected else (s, o)
        return _rules.binary(name, a, b, CONFIG.features, op=op, int_literal=int_literal).type

    inner = refined.matmul(op) if name == "matmul" else refined.elementwise(name, op)

    if scale is not None:  # the runtime's operands, in the rule's order, for `share_of`
        inner = refined.with_scale(name, inner, (scale, None) if reflected else (None, scale))

    def refine(out: SpmdType, s: refined.Val, o: refined.Val) -> tuple[Refinement, int | None]:
        return inner(out, *((o, s) if reflected else (s, o)))
    refine.from_plain = getattr(inner, "from_plain", False)  # type: ignore[attr-defined]

    return refined.rapply(ctx.api, ctx.context, default, [self_alts, other_alts], fn, refine, on_error)


def _scalar_comparison(ctx: MethodContext, name: str, _reflected: bool, op: str) -> Type:
    """`0 == x` with a typed `x`: the runtime's `x == 0` (`_rules.binary(name, x, 0)`)."""
    default = ctx.default_return_type
    if not ctx.args or not ctx.args[0] or not is_sarray(ctx.arg_types[0][0]):
        return default
    alts = refined.ralternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if alts is None:
        return default
    inner = refined.elementwise(name, op)
    return refined.rapply(ctx.api, ctx.context, default, [alts],
                          lambda x: _rules.binary(name, x, LITERAL, CONFIG.features, op=op).type,
                          lambda out, v: inner(out, v, refined.Val(LITERAL, rank=0)))


def _unary_rule(name: str, binding: str, op: str) -> Callable[[SpmdType], SpmdType]:
    """The rule of a one-operand row: `unary`, or `mean_type` for the "mean" binding."""
    if binding == "mean":
        return lambda t: _rules.mean_type(t, CONFIG.features, op=op)
    return lambda t: _rules.unary(name, t, CONFIG.features, op=op)


def _unary(ctx: MethodContext | AttributeContext, name: str, binding: str, op: str) -> Type:
    default = ctx.default_return_type if isinstance(ctx, MethodContext) else ctx.default_attr_type
    if isinstance(ctx, MethodContext) and passes_arguments(ctx, name):
        pos, kw = call_arguments(ctx)
        return typed_call(ctx, name, (None, ctx.type), pos, kw, op, default)
    p = get_proper_type(ctx.type)
    s = _plain(p) if isinstance(p, Instance) else None
    if isinstance(s, SpmdType):  # no refinement: the four-state rule alone (`rapply`'s)
        try:
            out = _unary_rule(name, binding, op)(s)
        except SpmdTypeError as err:
            report(ctx.api, err, ctx.context)
            return default
        return from_spmd(ctx.api, out)
    alts = refined.ralternatives(ctx.api, ctx.type, None)
    if alts is None:
        return default
    return refined.rapply(ctx.api, ctx.context, default, [alts],
                          _unary_rule(name, binding, op),
                          _unary_refine(ctx, name, op))


def _unary_refine(ctx: MethodContext | AttributeContext, name: str, op: str) -> refined.Refine:
    """The `_refine` rule of a method / property, with its literal arguments."""
    if not isinstance(ctx, MethodContext):  # .T / .mT
        return refined.unary("transpose" if name == "transpose" and op == ".T" else "reshape", op)
    pos = [e for kinds, exprs in zip(ctx.arg_kinds, ctx.args, strict=True)
           for k, e in zip(kinds, exprs, strict=True) if k.is_positional()]
    axis_e = pos[0] if pos else _keyword(ctx, "axis")
    if _surface.refine_kind(name) == "reduction":
        keep = _keyword(ctx, "keepdims")
        return refined.unary(name, op, axis=refined.axis_arg(axis_e),
                             keepdims=isinstance(keep, NameExpr) and keep.fullname == "builtins.True")
    if name == "transpose":
        perm = [refined.int_value(e) for e in pos]
        if not perm:
            return refined.unary("transpose", op)
        if len(perm) == 1 and isinstance(pos[0], TupleExpr):
            perm = [refined.int_value(e) for e in pos[0].items]
        if all(p is not None for p in perm):
            return refined.unary("transpose", op, perm=[p for p in perm if p is not None])
        return refined.unary("reshape", op)
    if name in ("reshape", "ravel", "squeeze"):
        dims = [refined.int_value(e) for e in pos]
        if len(pos) == 1 and isinstance(pos[0], TupleExpr):
            dims = [refined.int_value(e) for e in pos[0].items]
        rank = 1 if name == "ravel" else (len(dims) if name == "reshape" and dims
                                          and all(d is not None for d in dims) else None)
        return refined.unary(name, op, new_rank=rank)
    return refined.unary(name, op)


def _keyword(ctx: MethodContext, name: str) -> Expression | None:
    for names, exprs in zip(ctx.arg_names, ctx.args, strict=True):
        for n, e in zip(names, exprs, strict=True):
            if n == name:
                return e
    return None


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
        ralts = refined.ralternatives(ctx.api, ctx.type, None)
        if ralts is None:
            return default
        follow = None  # the dims, where the value's rank is known (`extents.index`)
        if isinstance(ctx.context, IndexExpr) and any(v.rank is not None for v in ralts):
            follow = extents.index(ctx.api, ctx.context.index)
        return refined.rapply(ctx.api, ctx.context, default, [ralts],
                              lambda t: _rules.unary(_STATIC_INDEX, t, CONFIG.features, op="indexing"),
                              follow or refined.unary("getitem", "indexing"))
    if any(isinstance(a, SpmdType) and a.reduced for a in alts) \
            and not CONFIG.features.gather_keeps_reduced and not _scalar_indices(ctx):
        # a scalar index slices (Reduced kept), an index array gathers (jax 0.10 drops
        # Reduced): the plugin cannot tell a typed scalar from a typed array; check only
        apply(ctx.api, ctx.context, default, [alts],
              lambda t: _rules.dynamic_index_type(t, index_types, CONFIG.features, op="indexing"))
        return default
    return apply(ctx.api, ctx.context, default, [alts],
                 lambda t: _rules.dynamic_index_type(t, index_types, CONFIG.features, op="indexing"))


def _lookup(ctx: MethodContext, expr: Any) -> Type:
    """The type mypy already inferred for `expr` (KeyError when none): no second check."""
    t: Type = getattr(ctx.api, "lookup_type")(expr)  # noqa: B009 - TypeChecker, not the interface
    return t


def _scalar_indices(ctx: MethodContext) -> bool:
    """Whether every typed index of `x[...]` is visibly a scalar (`st.axis_index(...)`)."""
    expr = ctx.args[0][0] if ctx.args and ctx.args[0] else None
    items = expr.items if isinstance(expr, TupleExpr) else [expr]
    for item in items:
        try:
            p = get_proper_type(_lookup(ctx, item)) if item is not None else None
        except KeyError:
            return False
        if p is not None and is_sarray(p) and not (
                isinstance(item, CallExpr) and isinstance(item.callee, RefExpr)
                and item.callee.fullname.endswith(".axis_index")):
            return False
    return True


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
    index = _at_index_types(ctx)
    if index is None:
        return default  # a raw JAX index: its state is unknown statically

    def fn(v: Known) -> SpmdType:
        return _rules.at_update_type(method, x, v, CONFIG.features, op=op, index=index)

    return apply(ctx.api, ctx.context, default, [values], fn)


def _at_index_types(ctx: MethodContext) -> list[SpmdType] | None:
    """The states of the typed indices of `x.at[idx].<method>(v)` (read from the call's callee
    expression); None when an index is a raw JAX array (state unknown)."""
    call = ctx.context
    callee = getattr(call, "callee", None)
    index_expr = getattr(getattr(callee, "expr", None), "index", None)
    if not isinstance(callee, MemberExpr) or not isinstance(callee.expr, IndexExpr) \
            or index_expr is None:
        return []
    try:
        it = get_proper_type(_lookup(ctx, index_expr))
    except KeyError:
        return []
    if it is None:
        return []
    items = list(it.items) if isinstance(it, TupleType) else [it]
    out: list[SpmdType] = []
    for item in items:
        p = get_proper_type(item)
        if is_sarray(p):
            o = to_operand(p)
            if not isinstance(o, SpmdType):
                return None
            out.append(o)
        elif isinstance(p, AnyType) or (isinstance(p, Instance)
                                        and p.type.fullname == "jax._src.basearray.Array"):
            return None
    return out


def _builtin(ctx: FunctionContext, name: str, binding: str, op: str) -> Type:
    """`abs(x)` (builtins.abs does not go through the `__abs__` method hook)."""
    if not ctx.arg_types or not ctx.arg_types[0]:
        return ctx.default_return_type
    alts = alternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if alts is None or LITERAL in alts:
        return ctx.default_return_type
    ralts = refined.ralternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if ralts is None:
        return ctx.default_return_type
    return refined.rapply(ctx.api, ctx.context, ctx.default_return_type, [refined.arrays(ralts)],
                          _unary_rule(name, binding, op), refined.unary(name, op))

