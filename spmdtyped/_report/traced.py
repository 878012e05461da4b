"""The collectives of a traced program: one walk over the jaxpr `jax.make_jaxpr` returns.

Every equation is visited, nested jaxprs included (jit, shard_map bodies, scan / while with
their trip counts multiplied, cond branches, custom_jvp / custom_vjp, remat); each collective
primitive becomes a `Collective` named with the compiled program's op name (`all-reduce`,
`all-gather`, ...), its mesh axes, its bytes per device (the result's size, as the compiled
program's shapes give it), its phase (an equation made by transposition has `transpose` in its
name stack) and its origin (the user called a collective of that kind, autodiff made it, or
JAX did). Explicit-mode `reshard`s are priced from their input and output `PartitionSpec`s, and
so are the partial sums of a `dot_general` contracting (or a `reduce_sum` over) sharded
dimensions, which the compiled program all-reduces.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from .. import _compat
from .._engine import walk as _walk

#: the jaxpr primitives that communicate (jax 0.10 and 0.12 names, `_compat.primitive_name`)
#: -> the compiled program's op name
KINDS = {
    "psum": "all-reduce", "psum_invariant": "all-reduce", "unreduced_psum": "all-reduce",
    "pmax": "all-reduce", "pmin": "all-reduce", "unreduced_pmax": "all-reduce",
    "unreduced_pmin": "all-reduce", "psum2": "all-reduce",
    "all_gather": "all-gather", "all_gather_invariant": "all-gather",
    "all_gather_reduced": "all-gather",
    "reduce_scatter": "reduce-scatter", "unreduced_reduce_scatter": "reduce-scatter",
    "psum_scatter": "reduce-scatter",
    "ppermute": "collective-permute",
    "all_to_all": "all-to-all",
}
#: the user-facing API (a library function on the equation's stack) -> the kind it makes
API_KINDS = {"psum": "all-reduce", "pmean": "all-reduce", "pmax": "all-reduce",
             "pmin": "all-reduce", "all_gather": "all-gather", "psum_scatter": "reduce-scatter",
             "ppermute": "collective-permute", "pshuffle": "collective-permute",
             "all_to_all": "all-to-all", "pbroadcast": "collective-permute"}
#: Explicit-mode primitives whose communication follows from their in and out shardings
RESHARDS = ("reshard", "sharding_constraint")
#: Explicit-mode primitives that sum (or take the max / min) over dimensions: when the operands
#: shard those dimensions, each device holds a partial result that the compiled program reduces
PARTIALS = ("dot_general", "reduce_sum", "reduce_max", "reduce_min")
#: loops: the parameter that holds the trip count
_LOOPS = {"scan": "length"}


@dataclasses.dataclass
class Collective:
    """One collective equation of the traced program (per device, per step)."""

    kind: str
    axes: tuple[str, ...]
    #: executions per step: the product of the trip counts of the loops around it
    count: int
    #: bytes of one execution's result, per device
    unit_bytes: int
    phase: str
    origin: str
    where: str | None
    primitive: str
    #: the size of the device group (the product of the axes' sizes), None when unknown
    group: int | None = None
    #: the loops around it, innermost first: ("scan", length) / ("while", None)
    loops: tuple[tuple[str, int | None], ...] = ()
    #: (constants, carries) of the loop whose body holds it directly, else None
    carry: tuple[int, int] | None = None
    #: the equation itself and the jaxpr that holds it (the flags read them)
    eqn: Any = dataclasses.field(default=None, repr=False, compare=False)
    jaxpr: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def bytes(self) -> int:
        return self.unit_bytes * self.count

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "axes": list(self.axes), "count": self.count,
                "bytes": self.bytes, "phase": self.phase, "origin": self.origin,
                "where": self.where}


def aval_bytes(aval: Any) -> int:
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    return math.prod(int(d) for d in shape) * int(getattr(dtype, "itemsize", 0))


def eqn_axes(eqn: Any) -> tuple[str, ...]:
    """The mesh axes a collective equation acts on (its `axes` or `axis_name` param)."""
    raw = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    raw = (raw,) if isinstance(raw, str) else raw
    return tuple(a for a in raw if isinstance(a, str))


def _where(eqn: Any, parent: str | None) -> str | None:
    frame = _walk.user_frame(_compat.eqn_frames(eqn))
    return f"{frame[0]}:{frame[1]}" if frame is not None else parent


def _origin(eqn: Any, kind: str, backward: bool) -> str:
    """`user` when the user called a collective of this kind (also in a custom_vjp's bwd),
    `autodiff` for the rest of the backward pass, `jax` for the rest of the forward pass."""
    fns = _walk.library_functions(_compat.eqn_frames(eqn))
    if any(API_KINDS.get(fn) == kind for fn in fns):
        return "user"
    return "autodiff" if backward else "jax"


def _spec_axes(sharding: Any) -> tuple[list[set[str]], set[str]] | None:
    """Per dimension the mesh axes an Explicit-mode sharding splits it over, and its
    unreduced axes; None when the aval carries no named sharding."""
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return None
    dims: list[set[str]] = []
    for entry in _compat.spec_entries(spec):
        dims.append(set() if entry is None else {entry} if isinstance(entry, str) else set(entry))
    return dims, set(getattr(spec, "unreduced", ()) or ())


def reshard_collectives(eqn: Any) -> list[tuple[str, tuple[str, ...], int]]:
    """(kind, axes, result bytes per device) of an Explicit-mode reshard: an axis leaves the
    spec (all-gather), moves to another dimension (all-to-all), or stops being unreduced
    (all-reduce; reduce-scatter when it shards a dimension afterwards)."""
    src_aval, dst_aval = eqn.invars[0].aval, eqn.outvars[0].aval
    src = _spec_axes(getattr(src_aval, "sharding", None))
    dst = _spec_axes(getattr(dst_aval, "sharding", None))
    if src is None or dst is None:
        return []
    mesh = getattr(dst_aval.sharding, "mesh", None)
    sizes = dict(getattr(mesh, "shape", {}) or {})
    (sdims, sun), (ddims, dun) = src, dst
    local = aval_bytes(dst_aval)
    split = math.prod(sizes.get(a, 1) for d in ddims for a in d)
    local = local // max(split, 1)
    out: list[tuple[str, tuple[str, ...], int]] = []
    gathered = sorted(a for i, d in enumerate(sdims) for a in d
                      if not any(a in e for e in ddims))
    moved = sorted(a for i, d in enumerate(sdims) for a in d
                   if any(a in e for j, e in enumerate(ddims) if j != i))
    reduced = sorted(sun - dun)
    if reduced:
        scattered = [a for a in reduced if any(a in e for e in ddims)
                     and not any(a in d for d in sdims)]
        plain = [a for a in reduced if a not in scattered]
        if plain:
            out.append(("all-reduce", tuple(plain), local))
        if scattered:
            out.append(("reduce-scatter", tuple(scattered), local))
    if gathered:
        out.append(("all-gather", tuple(gathered), local))
    if moved:
        out.append(("all-to-all", tuple(moved), local))
    return out


def partial_collectives(eqn: Any) -> list[tuple[str, tuple[str, ...], int]]:
    """(kind, axes, result bytes per device) of an Explicit-mode `dot_general` whose contracted
    dimensions both operands shard over the same mesh axes, or of a `reduce_sum` / `_max` /
    `_min` over sharded dimensions: each device holds a partial result, and the compiled
    program all-reduces it over those axes (at the result's size before it is split over them:
    the SPMD partitioner reduces, then slices), unless the result's spec keeps them
    `unreduced` (the reduction is deferred to its reshard)."""
    name = _compat.primitive_name(eqn)
    out_aval = eqn.outvars[0].aval
    dst = _spec_axes(getattr(out_aval, "sharding", None))
    if dst is None:
        return []
    if name == "dot_general":
        (lc, rc), _ = eqn.params["dimension_numbers"]
        lhs = _spec_axes(getattr(eqn.invars[0].aval, "sharding", None))
        rhs = _spec_axes(getattr(eqn.invars[1].aval, "sharding", None))
        if lhs is None or rhs is None:
            return []
        axes = set().union(*(lhs[0][i] & rhs[0][j] for i, j in zip(lc, rc, strict=True)))
    else:
        src = _spec_axes(getattr(eqn.invars[0].aval, "sharding", None))
        if src is None:
            return []
        axes = set().union(*(src[0][d] for d in eqn.params.get("axes", ()) if d < len(src[0])))
    axes -= dst[1]
    if not axes:
        return []
    sizes = dict(getattr(getattr(out_aval.sharding, "mesh", None), "shape", {}) or {})
    split = math.prod(sizes.get(a, 1) for d in dst[0] for a in d if a not in axes)
    ordered = tuple(a for a in sizes if a in axes) or tuple(sorted(axes))
    return [("all-reduce", ordered, aval_bytes(out_aval) // max(split, 1))]


@dataclasses.dataclass
class _Context:
    sizes: dict[str, int]
    backward: bool
    loops: tuple[tuple[str, int | None], ...]
    count: int
    where: str | None
    #: the loop body this context walks, with its (constants, carries)
    body: Any = None
    carry: tuple[int, int] | None = None


class TracedWalk:
    """Walks a closed jaxpr and collects its `Collective`s (`.collectives`), the equations of
    every shard_map (`.shard_maps`) and the loops whose trip count it could not read."""

    def __init__(self) -> None:
        self.collectives: list[Collective] = []
        self.shard_maps: list[Any] = []
        self.unknown_trips: list[str | None] = []
        self.equations = 0
        #: id(a nested jaxpr) -> (the equation that holds it, the jaxpr that holds that)
        self.parents: dict[int, tuple[Any, Any]] = {}

    def run(self, closed: Any, sizes: dict[str, int] | None = None) -> TracedWalk:
        self._jaxpr(closed.jaxpr, _Context(dict(sizes or {}), False, (), 1, None))
        return self

    def _jaxpr(self, jaxpr: Any, ctx: _Context) -> None:
        for eqn in jaxpr.eqns:
            self.equations += 1
            self._eqn(eqn, jaxpr, ctx)

    def _eqn(self, eqn: Any, jaxpr: Any, ctx: _Context) -> None:
        name = _compat.primitive_name(eqn)
        backward = ctx.backward or "transpose" in str(getattr(eqn.source_info, "name_stack", ""))
        if name in KINDS:
            # one record per operand: the compiled program runs a psum of several operands
            # as one tuple op, and XLA's combiner merges separate psums the same way
            for v in eqn.outvars:
                self._record(eqn, jaxpr, ctx, KINDS[name], eqn_axes(eqn), backward,
                             aval_bytes(v.aval))
        elif name in RESHARDS:
            for kind, axes, nbytes in reshard_collectives(eqn):
                self._record(eqn, jaxpr, ctx, kind, axes, backward, nbytes, origin="jax")
        elif name in PARTIALS:
            for kind, axes, nbytes in partial_collectives(eqn):
                self._record(eqn, jaxpr, ctx, kind, axes, backward, nbytes, origin="jax")
        subs = _compat.sub_jaxprs(eqn)
        if not subs:
            return
        sizes, loops, count = ctx.sizes, ctx.loops, ctx.count
        if name == "shard_map":
            self.shard_maps.append(eqn)
            mesh = eqn.params.get("mesh")
            sizes = {**sizes, **dict(getattr(mesh, "shape", {}) or {})}
        if name in _LOOPS:
            n = int(eqn.params[_LOOPS[name]])
            loops, count = ((name, n), *loops), count * n
        elif name == "while":
            trips = while_trip_count(eqn)
            if trips is None:
                self.unknown_trips.append(_where(eqn, ctx.where))
            loops, count = (("while", trips), *loops), count * (trips or 1)
        where = _where(eqn, ctx.where)
        for sub in subs:
            if name == "while" and sub is _cond_jaxpr(eqn):
                continue  # the loop condition communicates nothing worth counting
            carry = None
            if name == "scan":
                carry = _compat.scan_counts(eqn)
            elif name == "while":
                carry = (int(eqn.params.get("body_nconsts", 0)), len(sub.outvars))
            self.parents[id(sub)] = (eqn, jaxpr)
            self._jaxpr(sub, _Context(sizes, backward, loops, count, where, sub, carry))

    def _record(self, eqn: Any, jaxpr: Any, ctx: _Context, kind: str, axes: tuple[str, ...],
                backward: bool, nbytes: int, origin: str | None = None) -> None:
        if not axes:
            return
        group = math.prod(ctx.sizes[a] for a in axes) if all(a in ctx.sizes for a in axes) \
            else None
        self.collectives.append(Collective(
            kind=kind, axes=axes, count=ctx.count, unit_bytes=nbytes,
            phase="backward" if backward else "forward",
            origin=origin or _origin(eqn, kind, backward), where=_where(eqn, ctx.where),
            primitive=_compat.primitive_name(eqn), group=group, loops=ctx.loops,
            carry=ctx.carry if jaxpr is ctx.body else None, eqn=eqn, jaxpr=jaxpr))


def _cond_jaxpr(eqn: Any) -> Any:
    c = eqn.params.get("cond_jaxpr")
    return getattr(c, "jaxpr", c)


def while_trip_count(eqn: Any) -> int | None:
    """The trip count of a `fori_loop`-shaped while: the condition is `i < upper`, with the
    counter's initial value and the bound both literals; None otherwise (a traced bound)."""
    cond = _cond_jaxpr(eqn)
    if cond is None or len(cond.eqns) != 1 or cond.eqns[0].primitive.name != "lt":
        return None
    nc, nb = int(eqn.params.get("cond_nconsts", 0)), int(eqn.params.get("body_nconsts", 0))
    inv = list(cond.invars)

    def value(v: Any) -> int | None:
        if v in inv:
            k = inv.index(v)
            v = eqn.invars[k] if k < nc else eqn.invars[nc + nb + k - nc]
        val = getattr(v, "val", None)
        try:
            return int(val) if val is not None else None
        except (TypeError, ValueError):
            return None

    lo, hi = value(cond.eqns[0].invars[0]), value(cond.eqns[0].invars[1])
    return None if lo is None or hi is None else max(hi - lo, 0)
