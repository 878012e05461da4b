"""Static extents (`Refinement.extents`): the names that hold the per-device extent of a sharded
dim, and where an index or `broadcast_to` puts such an extent.

The plugin knows no sizes. But in `b, h, t, d = q.shape` (or `h = q.shape[1]`) where `q`'s dim
1 is sharded over "tp", `h` is the local extent of a dim sharded over "tp". A replicated value
sliced to it, `sinks[:h]`, was built for the local shard, and laid along that dim it applies
the same values to every device's slice: `_refine.aligned_shard`'s SPMD215 reads the extent
as `LocalExtent`. Anything the plugin cannot follow has no extent (never a new error).
"""

from __future__ import annotations

from typing import Any

from mypy.nodes import (
    AssignmentStmt,
    EllipsisExpr,
    Expression,
    FuncItem,
    IndexExpr,
    LambdaExpr,
    ListExpr,
    MemberExpr,
    NameExpr,
    SliceExpr,
    TupleExpr,
)

from .._rules import SpmdType
from .._rules import refine as _refine
from .._rules.refine import Refinement
from .._rules.refine import shape as _refine_shape
from . import refined


def assignments(api: Any, name: NameExpr) -> list[tuple[Expression, int | None]]:
    """The values assigned to `name` by the statements of the enclosing function's body (or
    the module's), each with the name's position when it is one target of a tuple unpacking."""
    # a lambda's names are its enclosing function's (`jax.vmap(lambda x: g(p, x))`)
    fn = next((e for e in reversed(api.scope.stack)
               if isinstance(e, FuncItem) and not isinstance(e, LambdaExpr)), None)
    body = fn.body.body if fn is not None else getattr(api.tree, "defs", [])
    found: list[tuple[Expression, int | None]] = []
    for stmt in body:
        if not isinstance(stmt, AssignmentStmt):
            continue
        for lv in stmt.lvalues:
            if isinstance(lv, NameExpr) and lv.name == name.name:
                found.append((stmt.rvalue, None))
            elif isinstance(lv, TupleExpr):
                found.extend((stmt.rvalue, i) for i, item in enumerate(lv.items)
                             if isinstance(item, NameExpr) and item.name == name.name)
    return found


def local_extent(api: Any, expr: Expression | None) -> tuple[str, ...]:
    """The axes over which `expr` is the local extent of a sharded dim: `x.shape[i]`, or a name
    assigned exactly once from it or from an unpacking of `x.shape`; () when unknown."""
    position: int | None = None
    if isinstance(expr, NameExpr):
        found = assignments(api, expr)
        if len(found) != 1:
            return ()
        expr, position = found[0]
    if isinstance(expr, IndexExpr) and position is None:
        position = refined.int_value(expr.index)
        expr = expr.base
    if not (isinstance(expr, MemberExpr) and expr.name == "shape") or position is None:
        return ()
    try:
        t = api.lookup_type(expr.expr)  # already checked: the assignment comes first
    except (KeyError, AttributeError):
        return ()
    ref, rank = refined.read(t)
    if rank is None:
        return ()
    dim = _refine.neg_dim(position, rank)
    return tuple(a for a, k in ref.items if k == _refine.Shard(dim))


def _item(e: Expression) -> str | None:
    """`refine_shape.index`'s name of one static index item; None for anything else."""
    if isinstance(e, SliceExpr):
        return "slice:full" if e.begin_index is e.end_index is e.stride is None else "slice:part"
    if isinstance(e, NameExpr) and e.fullname == "builtins.None":
        return "none"
    if isinstance(e, EllipsisExpr):
        return "ellipsis"
    return "int" if refined.int_value(e) is not None else None


def _slice_extent(api: Any, e: Expression) -> tuple[str, ...]:
    """The axes of a slice `[:h]` / `[0:h]` whose stop is a local extent."""
    if not isinstance(e, SliceExpr) or e.stride is not None or e.end_index is None:
        return ()
    if e.begin_index is not None and refined.int_value(e.begin_index) != 0:
        return ()
    return local_extent(api, e.end_index)


def index(api: Any, index_expr: Expression) -> refined.Refine | None:
    """The refinement of `x[index_expr]` with static items, as the runtime's `index_items` /
    `refine_shape.index` read it, with the extents the slices make (`[:h]`) and keep; None
    for an index the plugin cannot read (the caller falls back to plain dims)."""
    exprs = index_expr.items if isinstance(index_expr, TupleExpr) else [index_expr]
    items = [_item(e) for e in exprs]
    if any(i is None for i in items) or items.count("ellipsis") > 1:
        return None
    names = [i for i in items if i is not None]
    made = [_slice_extent(api, e) for e in exprs]
    fallback = refined.unary("getitem", "indexing")

    def refine(out: SpmdType, v: refined.Val) -> tuple[Refinement, int | None]:
        consumed = sum(1 for i in names if i not in ("none", "ellipsis"))
        if v.rank is None or consumed > v.rank:
            return fallback(out, v)
        out_rank = v.rank - names.count("int") + names.count("none")
        ref = _refine_shape.index(v.state, v.ref, out, v.rank, names, out_rank)
        mapping, at = _refine_shape.index_dims(v.rank, names)
        kept = ((mapping.get(d + v.rank), axes) for d, axes in v.ref.extents)
        made_at = ((p, axes) for p, axes in zip(at, made, strict=True) if axes)
        extents = {p - out_rank: axes for p, axes in (*kept, *made_at) if p is not None}
        return ref.with_extents(tuple(sorted(extents.items()))), out_rank

    refine.from_plain = any(made)  # type: ignore[attr-defined]  # a slice of a plain value
    return refine


def broadcast_to(shape: Expression | None, op: str) -> refined.Refine:
    """`broadcast_to(x, shape)`: dims are right-aligned, so an extent keeps its dim (counted
    from the right); the rank is the shape's length when it is a literal tuple or list."""
    new_rank = len(shape.items) if isinstance(shape, TupleExpr | ListExpr) else None
    structural = refined.unary("broadcast_to", op, new_rank=new_rank)

    def refine(out: SpmdType, v: refined.Val) -> tuple[Refinement, int | None]:
        ref, rank = structural(out, v)
        if rank is None or not v.ref.extents:
            return ref, rank
        return ref.with_extents(tuple((d, a) for d, a in v.ref.extents if -d <= rank)), rank
    return refine
