"""The refinement walk's pure rules (see `refine_walk`): the equations whose results' refinements
read only the primitive, its params and its operands' types, refinements and shapes
(structural ops, reductions, per-dim ops, collectives). `RefineWalk._pure` memoizes them per
walk; a rule's error is raised, never kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _surface
from .._rules import LITERAL, SpmdType
from .._rules import refine as _r
from .._rules.refine import NONE, Arg, Refinement
from .._rules.refine import shape as _rs
from .refine_facts import (
    api_name,
    broadcast_ref,
    dot_spec,
    dynamic_slice_ref,
    eqn_axes,
    gather_ref,
    pad_ref,
    slice_items,
)

#: the primitives whose rule reads only the equation's params and its operands' types,
#: refinements and shapes: `RefineWalk._pure` memoizes them (and the collectives, reductions
#: and per-dim ops of `_surface.AXIS_PRIMITIVES` / `_surface.PRIMITIVE_REFINE`)
PURE = frozenset({"axis_index", "sort", "rev", "dot_general", "transpose", "reshape", "squeeze",
                  "expand_dims", "broadcast_in_dim", "slice", "dynamic_slice", "gather",
                  "concatenate", "pad", "iota", "optimization_barrier"})


def pure_rule(eqn: Any, name: str, ins: Sequence[Any], outs: Sequence[SpmdType],
              refs: Sequence[Refinement], shapes: Sequence[tuple[int, ...]],
              out_shape: tuple[int, ...]) -> list[Refinement]:
    """The rule of an equation of `PURE` (or a collective, reduction or per-dim op): its
    results' refinements from its params and its operands' types, refinements and shapes."""
    out = outs[0] if outs else SpmdType()
    op = name
    p = eqn.params
    if name in _surface.AXIS_PRIMITIVES:
        return collective(eqn, name, ins, outs, refs, shapes)
    kind, rule = _surface.PRIMITIVE_REFINE.get(name, (None, name))
    if name == "axis_index":
        return [_rs.axis_index(eqn_axes(eqn))]
    if name == "optimization_barrier":   # each output is its operand, unchanged
        return list(refs)
    if kind == "reduction":
        return [_r.reduction(rule, ins[0], refs[0], out, ndim=len(shapes[0]),
                             axis=tuple(p.get("axes", ())), op=op)]
    if name == "sort":
        dim = int(p.get("dimension", -1))
        got = [_r.along_dim(rule, t, r, o, ndim=len(s), axis=dim, op=op)
               for t, r, o, s in zip(ins, refs, outs, shapes, strict=False)]
        return got if len(ins) == 1 else _sorted_by_keys(got, ins, refs, int(p.get("num_keys", 1)))
    if name == "rev":
        dims = tuple(p.get("dimensions", ()))
        return [_r.along_dim(rule, ins[0], refs[0], out, ndim=len(shapes[0]),
                             axis=dims[0] if len(dims) == 1 else None, op=op)]
    if kind == "along":
        return [_r.along_dim(rule, ins[0], refs[0], out, ndim=len(shapes[0]),
                             axis=int(p.get("axis", 0)), op=op)]
    if name == "dot_general":
        spec = dot_spec(p["dimension_numbers"], len(shapes[0]), len(shapes[1]))
        args = [Arg(ins[0], refs[0], shapes[0]), Arg(ins[1], refs[1], shapes[1])]
        return [_r.einsum(spec, args, out, op="dot_general")]
    if name == "transpose":
        return [_rs.transpose(out, refs[0], tuple(p["permutation"]), len(shapes[0]))]
    if name == "reshape":
        return [_rs.reshape(out, refs[0], shapes[0], out_shape)]
    if name == "squeeze":
        return [_rs.squeeze(out, refs[0], len(shapes[0]), tuple(p["dimensions"]))]
    if name == "expand_dims":
        return [_rs.expand(out, refs[0], len(shapes[0]), tuple(p["dimensions"]))]
    if name == "broadcast_in_dim":
        return [broadcast_ref(out, refs[0], shapes[0], out_shape,
                           tuple(p["broadcast_dimensions"]))]
    if name == "slice":
        items = slice_items(shapes[0], p["start_indices"], p["limit_indices"],
                             p.get("strides"))
        return [_rs.index(ins[0], refs[0], out, len(shapes[0]), items, len(out_shape))]
    if name == "dynamic_slice":
        return [dynamic_slice_ref(ins, refs, out, shapes, tuple(p["slice_sizes"]))]
    if name == "gather":
        return [gather_ref(ins, refs, out, shapes, out_shape, p)]
    if name == "concatenate":
        args = [Arg(t, r, s) for t, r, s in zip(ins, refs, shapes, strict=True)]
        return [_rs.concatenate(args, out, axis=int(p["dimension"]), out_ndim=len(out_shape),
                                op="concatenate")]
    if name == "pad":
        return [pad_ref(ins[0], refs[0], out, shapes[0], p.get("padding_config", ()))]
    if name == "iota":
        return [NONE]
    raise AssertionError(f"{name} is not a pure rule")   # `_PURE` lists the branches above


def collective(eqn: Any, name: str, ins: Sequence[Any], outs: Sequence[SpmdType],
               refs: Sequence[Refinement], shapes: Sequence[tuple[int, ...]]) -> list[Refinement]:
    """The refinements of a collective's results (`_rules.refine.shape.collective`)."""
    rule = _surface.AXIS_PRIMITIVES[name]
    kind = {"pcast_varying": "pcast_varying"}.get(rule, rule)
    p = eqn.params
    params = {"axis": p.get("all_gather_dimension", p.get("axis", 0)),
              "tiled": p.get("tiled", False),
              "scatter_dimension": p.get("scatter_dimension", 0),
              "split_axis": p.get("split_axis", 0)}
    axes = eqn_axes(eqn)
    res = []
    for t, r, o, s in zip(ins, refs, outs, shapes, strict=False):
        if t is LITERAL:
            t = SpmdType()
        got = _rs.collective(kind, t, r, o, axes, shape=s, op=api_name(name), params=params)
        # a cast keeps what the value is made of (a constant stays a constant)
        res.append(got.with_data(r.data) if rule in ("pvary", "pcast_varying") else got)
    return res or [NONE]


def _sorted_by_keys(got: list[Refinement], ins: Sequence[Any], refs: Sequence[Refinement],
                    num_keys: int) -> list[Refinement]:
    """A sort of several operands permutes each by the keys (`jnp.argsort` sorts an iota by
    the values): an output is Rep / Partial only where no key varies, and carries data when
    a key does."""
    moved = {a for t, r in zip(ins[:num_keys], refs[:num_keys], strict=False) if t is not LITERAL
             for a in t.varying if _r.kind(t, r, a) not in (_r.FIXED, _r.REP)}
    data = any(r.data for r in refs[:num_keys])
    return [r.shards_only(moved).with_data(r.data or data) for r in got]
