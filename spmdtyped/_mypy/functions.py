"""`st.numpy` and `st.nn` functions and constructors: each function's rule and binding come from
its row of the surface table (`_surface.NUMPY`, `_surface.NN`), the rows spmdtyped/numpy.py and
nn.py are built from (the comment above `_surface.FUNCTION_BINDINGS` says what each binding
means); each binding calls the `_rules` function the runtime calls for it."""

from __future__ import annotations

from typing import Final

from mypy.nodes import Expression, ListExpr, StrExpr, TupleExpr
from mypy.plugin import FunctionContext
from mypy.typeops import make_simplified_union
from mypy.types import AnyType, Instance, TupleType, Type, get_proper_type

from .. import _rules, _surface
from .._rules import LITERAL, SpmdType
from .._rules.refine import Refinement
from .._rules.refine import shape as _refine_shape
from . import extents, names, refined
from .arguments import call_arguments, passes_arguments, typed_call
from .codes import apply
from .config import CONFIG
from .convert import (
    Known,
    alternatives,
    any_type,
    arrays_only,
    from_spmd,
    is_python_int,
    is_str,
    keyword,
    literal_value,
    named,
    positional,
    to_operand,
)

#: full name -> (module label, name, rule, binding)
FULLNAMES: Final = names.FUNCTIONS
_ARRAY_LIKE_STATIC: Final = frozenset({"builtins.list", "builtins.tuple", "builtins.int",
                                       "builtins.bool", "builtins.slice"})
_Args = list[tuple[Expression, Type]]


def analyze(ctx: FunctionContext, entry: tuple[str, str, str, str], op: str | None = None) -> Type:
    """`st.<module>.<name>(...)` (`entry`: module, name, rule, binding, as in `FULLNAMES`):
    the table's rule, bound as the runtime binds it. `op`: the form's label in messages
    (JAX's spelling of the same row, `jnp.exp`; default `st.<module>.<name>`)."""
    module, name, rule, binding = entry
    op = op or f"st.{module}.{name}"
    default = ctx.default_return_type
    args = positional(ctx)
    if binding in ("like", "new"):
        return _constructor(ctx, args, rule, binding, op)
    operands = _operands(ctx, args, binding)
    if operands is None:
        return default
    alts: list[list[refined.Val]] = []
    for expr, t in operands:
        a = refined.ralternatives(ctx.api, t, expr)
        if a is None:
            return default
        alts.append(a)
    if not alts:
        return default
    if all(all(v.op is LITERAL for v in a) for a in alts):  # `snp.sqrt(2.0)`: an Invariant array
        alts = [refined.arrays(a) for a in alts]
    if binding == "mean":
        return refined.rapply(ctx.api, ctx.context, default, [refined.arrays(alts[0])],
                              lambda t: _rules.mean_type(t, CONFIG.features, op=op),
                              _unary_refine(ctx, args, rule, binding, op))
    if binding == "take":  # `_operands` leaves a constant index out: LITERAL
        index = alts[1] if len(alts) > 1 else [refined.Val(LITERAL, rank=0)]
        return refined.rapply(ctx.api, ctx.context, default, [refined.arrays(alts[0]), index],
                              lambda t, i: _rules.take_type(t, i, CONFIG.features, op=op),
                              lambda out, x, i: _unary_refine(ctx, args, rule, binding, op)(out, x))
    if binding == "slice":  # dynamic_slice_in_dim(x, start, size, axis): `x[start]`'s rule
        start = alts[1] if len(alts) > 1 else [refined.Val(LITERAL, rank=0)]
        return refined.rapply(ctx.api, ctx.context, default, [refined.arrays(alts[0]), start],
                              lambda t, i: _rules.dynamic_index_type(
                                  t, [] if i is LITERAL else [i], CONFIG.features, op=op),
                              lambda out, x, i: _unary_refine(ctx, args, rule, binding, op)(out, x))
    if binding == "split":  # a list of pieces, each in the unary rule's state
        piece = refined.rapply(ctx.api, ctx.context, any_type(), [refined.arrays(alts[0])],
                               lambda t: _rules.unary(rule, t, CONFIG.features, op=op),
                               _unary_refine(ctx, args, rule, binding, op))
        if isinstance(get_proper_type(piece), AnyType):
            return default
        return named(ctx.api, "builtins.list", [piece])
    if binding == "where":
        if len(alts) != 3:
            return default
        return refined.rapply(ctx.api, ctx.context, default, alts,
                              lambda c, x, y: _rules.where_type(c, x, y, CONFIG.features, op=op).type,
                              _nary_refine(ctx, args, operands, rule, binding, op))
    if len(alts) == 1 and binding not in ("join", "nary", "einsum") \
            and passes_arguments(ctx, rule, skip=1):
        pos, kw = call_arguments(ctx)
        return typed_call(ctx, rule, operands[0], pos[1:], kw, op, default)
    if len(alts) == 1 and binding not in ("join", "nary", "einsum"):
        return refined.rapply(ctx.api, ctx.context, default, [refined.arrays(alts[0])],
                              lambda t: _rules.unary(rule, t, CONFIG.features, op=op),
                              _unary_refine(ctx, args, rule, binding, op))
    if binding == "binary" and len(alts) == 2:
        int_literal = is_python_int(get_proper_type(operands[1][1]))
        return refined.rapply(ctx.api, ctx.context, default, alts,
                              lambda a, b: _rules.binary(rule, a, b, CONFIG.features, op=op,
                                                         int_literal=int_literal).type,
                              refined.matmul(op) if rule in ("matmul", "dot")
                              else refined.elementwise(rule, op))
    return refined.rapply(ctx.api, ctx.context, default, alts,
                          lambda *ts: _rules.combine(rule, list(ts), CONFIG.features, op=op).type,
                          _nary_refine(ctx, args, operands, rule, binding, op))


def _unary_refine(ctx: FunctionContext, args: _Args, rule: str, binding: str, op: str
                  ) -> refined.Refine:
    """The `_refine` rule of a one-operand function, with its literal `axis` / `axes`."""
    axis = keyword(ctx, "axis")
    axis_e = args[1][0] if len(args) > 1 and binding not in ("take", "split", "slice") \
        else axis[0] if axis else None
    if rule in ("tril", "triu"):  # the last two dims, whatever `k`: a Shard there is plain
        return refined.unary(rule, op)
    if binding in ("take", "split"):
        axis_e = args[2][0] if len(args) > 2 else axis[0] if axis else None
    if binding == "slice":  # (operand, start_index, slice_size, axis=0)
        axis_e = args[3][0] if len(args) > 3 else axis[0] if axis else None
    if binding in ("slice", "split") and axis_e is None:  # JAX's default axis
        return refined.unary(rule, op, axis=(True, 0))
    if _surface.refine_kind(rule) in refined.AXIS_KINDS:
        keep = keyword(ctx, "keepdims")
        known, ax = refined.axis_arg(axis_e)
        if axis_e is None and rule in ("softmax", "log_softmax"):
            ax = -1  # jax.nn's default
        return refined.unary(rule, op, axis=(known, ax),
                             keepdims=keep is not None and literal_value(keep[1]) is True)
    if rule == "transpose":
        axes = keyword(ctx, "axes")
        e = args[1][0] if len(args) > 1 else axes[0] if axes else None
        if e is None:
            return refined.unary("transpose", op)
        if isinstance(e, TupleExpr | ListExpr):
            perm = [refined.int_value(i) for i in e.items]
            if all(p is not None for p in perm):
                return refined.unary("transpose", op, perm=[p for p in perm if p is not None])
        return refined.unary("reshape", op)
    if rule == "broadcast_to":
        shape = keyword(ctx, "shape")
        return extents.broadcast_to(args[1][0] if len(args) > 1 else shape[0] if shape else None, op)
    return refined.unary(rule, op)


def _nary_refine(ctx: FunctionContext, args: _Args, operands: _Args, rule: str, binding: str,
                 op: str) -> refined.Refine:
    """`where` (the owner mask `where(pred, x, 0)`), `einsum`, `concatenate` / `stack`."""
    if binding == "einsum":
        spec = args[0][0].value if args and isinstance(args[0][0], StrExpr) else None
        return refined.einsum(spec, op)
    if binding == "join":
        axis = keyword(ctx, "axis")
        known, ax = refined.axis_arg(args[1][0] if len(args) > 1 else axis[0] if axis else None)
        cat = 0 if known and ax is None and axis is None and len(args) < 2 else ax

        def join(out: SpmdType, *vals: refined.Val) -> tuple[Refinement, int | None]:
            rank = refined.max_rank(vals)
            if isinstance(cat, int) and rank is not None:
                out_rank = rank + 1 if rule == "stack" else rank
                return _refine_shape.concatenate([v.arg for v in vals], out, axis=cat, out_ndim=out_rank,
                                           op=op, stack=rule == "stack"), out_rank
            # dims unknown: the Partial rules still apply, a Shard falls back to plain
            ndim = max(refined.shard_depth(vals), abs(cat) if isinstance(cat, int) else 0) + 1
            ref = _refine_shape.concatenate([v.arg for v in vals], out, axis=cat if isinstance(cat, int)
                                      else 0, out_ndim=ndim, op=op, stack=rule == "stack")
            return _refine_shape.dims_unknown(out, ref, out), None
        return join
    fill = len(operands) == 3 and refined.is_zero(operands[2][0])
    return refined.elementwise(rule, op, onehot_fill=fill)


def _operands(ctx: FunctionContext, args: _Args, binding: str) -> _Args | None:
    """The arguments whose states the rule combines (None: unknown statically)."""
    if not args:
        return None
    if binding == "join":
        seq = args[0][0]
        if not isinstance(seq, (ListExpr, TupleExpr)):
            return None
        return [(item, ctx.api.get_expression_type(item, None)) for item in seq.items]
    if binding in ("nary", "einsum", "where"):
        return [(e, t) for e, t in args if not is_str(t)]  # einsum's subscripts
    if binding == "slice":  # the array and its start index
        return args[:2] if len(args) >= 2 else None
    if binding == "binary":
        return args[:2] if len(args) >= 2 else None
    if binding == "take":
        index = args[1] if len(args) > 1 else keyword(ctx, "indices")
        if index is None:
            return None
        it = get_proper_type(index[1])
        io = to_operand(it)
        if isinstance(io, SpmdType) and io.axes:
            return [args[0], index]  # a traced index with a state: both operands
        if io is LITERAL or isinstance(io, SpmdType) or isinstance(it, TupleType) or (
                isinstance(it, Instance) and it.type.fullname in _ARRAY_LIKE_STATIC):
            return args[:1]  # a static (or Invariant) index: unary on the array
        return None  # a raw JAX index: its state is unknown statically
    return args[:1]


def _constructor(ctx: FunctionContext, args: _Args, rule: str, binding: str, op: str) -> Type:
    """`zeros`, `full`, `zeros_like`, ...: `_rules.constructor_type`, joined (`add`) with the
    state of a typed fill value as `st.numpy.full` does."""
    default = ctx.default_return_type
    if binding == "like":
        if not args:
            return default
        like = alternatives(ctx.api, args[0][1], args[0][0])
        if like is None:
            return default
        bases = [_rules.constructor_type(rule, t, CONFIG.features) for t in arrays_only(like)]
    else:
        bases = [_rules.constructor_type(rule)]
    if rule not in _rules.FILL_ARGUMENTS:
        return make_simplified_union([from_spmd(ctx.api, t) for t in bases])
    # full(shape, fill_value), full_like(a, fill_value), linspace(start, stop, ...)
    fills: list[list[Known]] = []
    for position, key in _rules.FILL_ARGUMENTS[rule]:
        fill = args[position] if len(args) > position else keyword(ctx, key)
        alts = [LITERAL] if fill is None else alternatives(ctx.api, fill[1], fill[0])
        if alts is None:
            return default
        fills.append(list(alts))

    def fn(base: SpmdType, *fs: Known) -> SpmdType:
        for f in fs:
            base = _rules.fill_type(base, f, CONFIG.features, op=op)
        return base

    return apply(ctx.api, ctx.context, default, [bases, *fills], fn)
