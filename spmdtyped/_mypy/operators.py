"""Operators and array methods (the dispatch of `_array.binary` / `getattr_` / `getitem` /
`_AtIndex._update`): every Python form of a typed value goes through the rule the runtime
uses for it (`_rules.binary`, `unary`, `dynamic_index_type`, `combine`)."""

from __future__ import annotations

from typing import Final

from mypy.nodes import Expression, NameExpr, TupleExpr
from mypy.plugin import AttributeContext, FunctionContext, MethodContext
from mypy.types import AnyType, Instance, TupleType, Type, get_proper_type

from .. import _rules
from .._refine import Refinement
from .._rules import LITERAL, SpmdType
from . import refined
from .codes import apply, report, report_past_operator_fallback
from .config import CONFIG
from .convert import (
    SARRAY,
    STATIC,
    Known,
    alternatives,
    is_python_int,
    is_sarray,
    state_of_args,
    to_operand,
)

# operator method -> (rule name, the runtime's op label); the reflected `__r<name>__` of each
# name in _REFLECTED too (the runtime's `_hints` defines the same set)
_SYMBOLS: Final = {"add": "+", "sub": "-", "mul": "*", "truediv": "/", "matmul": "@", "pow": "**",
                   "mod": "%", "floordiv": "//", "and": "&", "or": "|", "xor": "^",
                   "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_RULES: Final = {"truediv": "div"}
_REFLECTED: Final = ("add", "sub", "mul", "truediv", "matmul", "pow", "mod", "floordiv", "and",
                     "or", "xor")
#: method -> (rule, reflected, op label)
BINARY: Final = {
    **{f"__{m}__": (_RULES.get(m, m), False, f"operator {s}") for m, s in _SYMBOLS.items()},
    **{f"__r{m}__": (_RULES.get(m, m), True, f"operator {_SYMBOLS[m]}") for m in _REFLECTED},
}
#: array method / operator -> (rule name, the runtime's op label)
UNARY: Final = {
    "__neg__": ("neg", "neg"), "__abs__": ("abs", "abs"), "__invert__": ("logical_not", "logical_not"),
    "reshape": ("reshape", ".reshape()"), "transpose": ("transpose", ".transpose()"),
    "astype": ("astype", ".astype()"), "squeeze": ("squeeze", ".squeeze()"),
    "ravel": ("ravel", ".ravel()"), "sum": ("sum", ".sum()"), "max": ("max", ".max()"),
    "min": ("min", ".min()"), "mean": ("mean", ".mean()"),
}
PROPERTIES: Final = {"T": ("transpose", ".T"), "mT": ("transpose", ".mT")}
#: `x.at[idx].<method>(v)` -> the rule (`_array._AT_RULES`)
AT_METHODS: Final = {"set": "at_set", "add": "at_add", "multiply": "at_mul", "min": "at_min",
                     "max": "at_max"}
AT_INDEX: Final = f"{STATIC}._AtIndex"

#: `0 == x`: Python's `int.__eq__` gives NotImplemented, then `x.__eq__(0)` runs (mypy would
#: type it `bool` through `int.__eq__(object)`)
SCALAR_COMPARISONS: Final = {f"builtins.{c}.__{m}__": f"scalar.{m}"
                             for c in ("int", "float", "bool", "complex") for m in ("eq", "ne")}
#: full name -> feature key of `analyze`
METHODS: Final = {**{f"{SARRAY}.{m}": m for m in (*BINARY, *UNARY, "__getitem__")},
                  **{f"{AT_INDEX}.{m}": f"at.{m}" for m in AT_METHODS}, **SCALAR_COMPARISONS}
ATTRIBUTES: Final = {f"{SARRAY}.{a}": a for a in PROPERTIES}
FUNCTIONS: Final = {"builtins.abs": "abs"}


def analyze(ctx: MethodContext | AttributeContext | FunctionContext, feature: str) -> Type:
    """The result of operator / method / property `feature` of a typed value."""
    if isinstance(ctx, FunctionContext):
        return _abs(ctx)
    if isinstance(ctx, AttributeContext):
        name, op = PROPERTIES[feature]
        return _unary(ctx, name, op)
    if feature in BINARY:
        return _binary(ctx, *BINARY[feature])
    if feature in UNARY:
        return _unary(ctx, *UNARY[feature])
    if feature == "__getitem__":
        return _getitem(ctx)
    if feature.startswith("scalar."):
        return _scalar_comparison(ctx, feature.partition(".")[2])
    return _at(ctx, feature.partition(".")[2])


def _binary(ctx: MethodContext, name: str, reflected: bool, op: str) -> Type:
    default = ctx.default_return_type
    if not ctx.args or not ctx.args[0]:
        return default
    self_alts = refined.ralternatives(ctx.api, ctx.type, None)
    other_t = ctx.arg_types[0][0]
    other_alts = refined.ralternatives(ctx.api, other_t, ctx.args[0][0])
    if self_alts is None or other_alts is None:
        return default
    p = get_proper_type(other_t)
    # as `_array.binary`: an int exponent is `integer_pow` (a bool is not an int there)
    int_literal = not reflected and is_python_int(p)

    def fn(s: Known, o: Known) -> SpmdType:
        a, b = (o, s) if reflected else (s, o)
        return _rules.binary(name, a, b, CONFIG.features, op=op, int_literal=int_literal).type

    inner = refined.matmul(op) if name == "matmul" else refined.elementwise(name, op)

    def refine(out: SpmdType, s: refined.Val, o: refined.Val) -> tuple[Refinement, int | None]:
        return inner(out, *((o, s) if reflected else (s, o)))

    # `2.0 + u`: mypy tried `float.__add__` first and would report its generic `[operator]`
    # error instead of the rule's; `u == 0.0`: mypy would fall back to `float.__eq__(object)`
    # and type it `bool` silently. Report the rule's error past that fallback.
    past = (reflected or name in ("eq", "ne")) and not is_sarray(other_t)
    on_error = report_past_operator_fallback if past else report
    return refined.rapply(ctx.api, ctx.context, default, [self_alts, other_alts], fn, refine, on_error)


def _scalar_comparison(ctx: MethodContext, name: str) -> Type:
    """`0 == x` with a typed `x`: the runtime's `x == 0` (`_rules.binary(name, x, 0)`)."""
    default = ctx.default_return_type
    if not ctx.args or not ctx.args[0] or not is_sarray(ctx.arg_types[0][0]):
        return default
    alts = refined.ralternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if alts is None:
        return default
    op = f"operator {_SYMBOLS[name]}"
    inner = refined.elementwise(name, op)
    return refined.rapply(ctx.api, ctx.context, default, [alts],
                          lambda x: _rules.binary(name, x, LITERAL, CONFIG.features, op=op).type,
                          lambda out, v: inner(out, v, refined.Val(LITERAL, rank=0)))


def _unary(ctx: MethodContext | AttributeContext, name: str, op: str) -> Type:
    default = ctx.default_return_type if isinstance(ctx, MethodContext) else ctx.default_attr_type
    alts = refined.ralternatives(ctx.api, ctx.type, None)
    if alts is None:
        return default
    return refined.rapply(ctx.api, ctx.context, default, [alts],
                          lambda t: _rules.unary(name, t, CONFIG.features, op=op),
                          _unary_refine(ctx, name, op))


def _unary_refine(ctx: MethodContext | AttributeContext, name: str, op: str) -> refined.Refine:
    """The `_refine` rule of a method / property, with its literal arguments."""
    if not isinstance(ctx, MethodContext):  # .T / .mT
        return refined.unary("transpose" if name == "transpose" and op == ".T" else "reshape", op)
    pos = [e for kinds, exprs in zip(ctx.arg_kinds, ctx.args, strict=True)
           for k, e in zip(kinds, exprs, strict=True) if k.is_positional()]
    axis_e = pos[0] if pos else _keyword(ctx, "axis")
    if name in refined.REDUCTIONS:
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
        return refined.rapply(ctx.api, ctx.context, default, [ralts],
                              lambda t: _rules.unary("getitem", t, CONFIG.features, op="indexing"),
                              refined.unary("getitem", "indexing"))
    return apply(ctx.api, ctx.context, default, [alts],
                 lambda t: _rules.dynamic_index_type(t, index_types, CONFIG.features, op="indexing"))


def _at(ctx: MethodContext, method: str) -> Type:
    """`x.at[idx].<method>(v)`, as `_array._AtIndex._update`: the rule on `x`, joined (`add`)
    with the rule on `v` when `v` is an array."""
    default = ctx.default_return_type
    p = get_proper_type(ctx.type)
    x = state_of_args(p.args) if isinstance(p, Instance) else None
    if x is None or not ctx.args or not ctx.args[0]:
        return default
    values = alternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if values is None:
        return default
    rule, op = AT_METHODS[method], f".at[].{method}()"

    def fn(v: Known) -> SpmdType:
        joined = _rules.unary(rule, x, CONFIG.features, op=op)
        if v is LITERAL:
            return joined
        assert isinstance(v, SpmdType)
        return _rules.combine("add", [joined, _rules.unary(rule, v, CONFIG.features, op=op)],
                              CONFIG.features, op=op).type

    return apply(ctx.api, ctx.context, default, [values], fn)


def _abs(ctx: FunctionContext) -> Type:
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
                          lambda t: _rules.unary("abs", t, CONFIG.features, op="abs"),
                          refined.unary("abs", "abs"))

