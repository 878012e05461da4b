"""Facts the refinement walk of `infer` needs beside the refinements (see `_refine_walk`):
jaxpr plumbing (literals, shapes, axes, dot_general as an einsum), structural rules of
primitives that have no `refine_shape` counterpart (broadcast_in_dim, slice, pad, scan
slices), what the refinements do not say about a value (`Side`: broadcast dims, constants,
zeros, division by an axis size). The walk's own errors are `refine_pending`'s.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from .. import _compat, _rules, _surface
from .._rules import LITERAL, SpmdType
from .._rules import refine as _r
from .._rules.refine import FIXED, INDEX, REP, Refinement, Shard
from .._rules.refine import shape as _rs

AUTODIFF_FUNCTIONS = ("tangent_fun", "backward_pass", "transpose", "_linear_jvp")
#: the casts whose result holds the scalar constant its operand holds (`RefineWalk.scalars`)
CARRY_SCALARS = frozenset({"pvary", "convert_element_type", "reduced_vary_cast"})


class ByIdentity:
    """A memo of `fn(obj, *rest)` keyed by `obj`'s identity and `rest`: for an equation's
    frames (`_compat.eqn_frames`: one tuple per traceback, which hashing would walk frame by
    frame at every equation of every walk). Each entry holds `obj`, so its id stays its own;
    the memo is emptied when it reaches `size` entries."""

    def __init__(self, fn: Any, size: int = 1 << 16) -> None:
        self.fn, self.size = fn, size
        self.memo: dict[Any, tuple[Any, Any]] = {}

    def __call__(self, obj: Any, *rest: Any) -> Any:
        key = (id(obj), *rest) if rest else id(obj)
        hit = self.memo.get(key)
        if hit is not None and hit[0] is obj:
            return hit[1]
        got = self.fn(obj, *rest)
        if len(self.memo) >= self.size:
            self.memo.clear()
        self.memo[key] = (obj, got)
        return got


def from_autodiff(frames: Sequence[tuple[str, int, str]], user: Any) -> bool:
    """Whether JAX's autodiff generated the equation (a tangent or a transposed equation):
    one of the library functions between the bind and the user's frame says so."""
    if isinstance(frames, tuple) and (user is None or isinstance(user, tuple)):
        return _from_autodiff(frames, user)
    return _scan_autodiff(frames, user)


def _scan_autodiff(frames: Sequence[tuple[str, int, str]], user: Any) -> bool:
    for file, line, fn in frames:
        if user is not None and (file, line) == tuple(user):
            return False
        if any(k in fn for k in AUTODIFF_FUNCTIONS):
            return True
    return False


_from_autodiff = ByIdentity(_scan_autodiff)


def is_literal(v: Any) -> bool:
    return type(v).__name__ == "Literal"


_INVARIANT = SpmdType()


def var_type(v: Any, types: Mapping[Any, SpmdType] | None) -> SpmdType:
    """The state of the value `v`: JAX's (its aval's), or where `types` is given (a
    `check_vma=False` program, whose values JAX types Invariant) the one `types` holds, read
    from what the program computes (`unchecked.UncheckedWalk.types`; Invariant if absent)."""
    if types is None:
        return _compat.aval_type(v.aval)
    return _INVARIANT if is_literal(v) else types.get(v, _INVARIANT)


def shape_of(v: Any) -> tuple[int, ...]:
    """The shape of the value `v`: its extents as ints, a symbolic one (`jax.export`'s shape
    polymorphism) kept as JAX's dimension expression (`_rules.refine.shape.dims`)."""
    aval = getattr(v, "aval", None)
    return _rs.dims(getattr(aval, "shape", ()) or ())


def eqn_axes(eqn: Any) -> tuple[str, ...]:
    p = eqn.params
    a = p.get("axes", p.get("axis_name", ()))
    if isinstance(a, str):
        return (a,)
    return tuple(x for x in a if isinstance(x, str))


def api_name(name: str) -> str:
    return f"jax.lax.{name}" if name in _surface.AXIS_PRIMITIVES else name


def dot_spec(dn: Any, lhs_ndim: int, rhs_ndim: int) -> str:
    """`dot_general`'s dimension numbers as an einsum spec (batch, lhs free, rhs free)."""
    (lc, rc), (lb, rb) = dn
    letters = iter("abcdefghijklmnopqrstuvwxyz")
    lhs = [""] * lhs_ndim
    rhs = [""] * rhs_ndim
    out_b, out_l, out_r = [], [], []
    for i, j in zip(lb, rb, strict=True):
        c = next(letters)
        lhs[i] = rhs[j] = c
        out_b.append(c)
    for i, j in zip(lc, rc, strict=True):
        c = next(letters)
        lhs[i] = rhs[j] = c
    for i in range(lhs_ndim):
        if not lhs[i]:
            lhs[i] = next(letters)
            out_l.append(lhs[i])
    for j in range(rhs_ndim):
        if not rhs[j]:
            rhs[j] = next(letters)
            out_r.append(rhs[j])
    return f"{''.join(lhs)},{''.join(rhs)}->{''.join(out_b + out_l + out_r)}"


def broadcast_ref(out: SpmdType, ref: Refinement, shape: tuple[int, ...], out_shape: tuple[int, ...],
               bdims: tuple[int, ...]) -> Refinement:
    res: dict[str, Any] = {}
    for a, k in ref.items:
        if isinstance(k, Shard):
            src = k.dim + len(shape)
            if 0 <= src < len(bdims) and shape[src] == out_shape[bdims[src]]:
                res[a] = Shard(bdims[src] - len(out_shape))
        else:
            res[a] = k
    return Refinement.of(res, ref.data).restrict(out.varying)


def slice_items(shape: tuple[int, ...], start: Sequence[int], limit: Sequence[int],
                 strides: Sequence[int] | None) -> list[str]:
    items = []
    for d, n in enumerate(shape):
        s = strides[d] if strides else 1
        items.append("slice:full" if start[d] == 0 and limit[d] == n and s in (1, None)
                     else "slice:part")
    return items


def pad_ref(t: Any, ref: Refinement, out: SpmdType, shape: tuple[int, ...], config: Any) -> Refinement:
    res: dict[str, Any] = {}
    for a, k in ref.items:
        if isinstance(k, Shard):
            lo, hi, interior = config[k.dim + len(shape)]
            if lo or hi or interior:
                continue
        res[a] = k
    return Refinement.of(res, ref.data).restrict(out.varying)


def drop_leading(ref: Refinement, ndim: int) -> Refinement:
    """A scan slice: the leading dim is gone (a Shard on it is lost)."""
    return Refinement.of({a: k for a, k in ref.items
                          if not (isinstance(k, Shard) and k.dim == -ndim)}, ref.data)


def diverged(ref: Refinement, axes: frozenset[str]) -> Refinement:
    """After devices took different paths over `axes`, only Shards (layouts) still hold."""
    if not axes:
        return ref
    return Refinement.of({a: k for a, k in ref.items if a not in axes or isinstance(k, Shard)},
                         ref.data)




#: the content facts of `Side` (sets of axes per value; `lineage` a bit set of inputs), in
#: `export`'s order
CONTENT = ("same", "gathered", "sliced", "accum", "own", "moved", "unsure", "lineage")


#: the facts of `Side` kept as sets of values, and those kept as a dict per value (but
#: lineage and sums): what `Side.replayable` reads
_SETS = ("const", "zero", "grad")
_DICTS = ("scaled", "bcast") + CONTENT[:CONTENT.index("lineage")]


_SIDES = itertools.count()


def exported_sums(facts: tuple[Any, ...]) -> tuple[Any, ...]:
    """The sums of in_spec Shards and diagonal blocks (`Side.summed`) among the facts
    `Side.export` gave a value; empty when it has none."""
    content = facts[5] if len(facts) > 5 else None
    return content[len(CONTENT)] if content else ()


class Side:
    """What the refinements do not say about a value: which dims it was broadcast along
    (constant there: its real extent is 1), whether it is a constant built in the program
    (no array data), whether it is zero, and which axes' sizes it was divided by."""

    def __init__(self) -> None:
        self.bcast: dict[Any, frozenset[int]] = {}
        self.const: set[Any] = set()
        self.zero: set[Any] = set()
        self.scaled: dict[Any, frozenset[str]] = {}
        #: values computed from a gradient the body computes (`gradients.read`)
        self.grad: set[Any] = set()
        #: what the content of a value is across the devices of an axis (`refine_content`):
        #: the same (a gather or a cast), gathered, a known slice, per-device contributions
        self.same: dict[Any, frozenset[str]] = {}
        self.gathered: dict[Any, frozenset[str]] = {}
        self.sliced: dict[Any, frozenset[str]] = {}
        self.accum: dict[Any, frozenset[str]] = {}
        #: this device's member of an in_spec stack (a dim sharded over the axis, one per
        #: device, squeezed away: `w[0]` of this device's expert weights)
        self.own: dict[Any, frozenset[str]] = {}
        #: axes over which other devices' data was brought into the value (computed from a
        #: `ppermute`, `all_gather` or `all_to_all` over them): a diagonal block combined with
        #: it is one term of the whole (`refine_content.Block`)
        self.moved: dict[Any, frozenset[str]] = {}
        #: axes JAX types a value Invariant on though an input of it varies there (argsort's
        #: permutation of varying keys): a cast of it is not `same`
        self.unsure: dict[Any, frozenset[str]] = {}
        #: the shard_map inputs a value is computed from: a bit set (bit i: input i), so that
        #: the union per equation costs a machine word per 64 inputs, not a set per input
        self.lineage: dict[Any, int] = {}
        #: var -> the sums of in_spec Shards it is computed from (`refine_content.Summed`)
        self.summed: dict[Any, tuple[Any, ...]] = {}
        #: the equations of the jaxpr walked (`defining`)
        self.eqns: Sequence[Any] = ()
        self._defs: dict[Any, Any] | None = None
        #: var -> the number of what the walk knows of it, once read (`transfer.fact_id`)
        self.ids: dict[Any, int] = {}
        #: this walk's own number (`lineage` bits name this jaxpr's inputs: a fact that holds
        #: lineage of another walk is told apart by it)
        self.serial: int = next(_SIDES)
        #: the states the walk reads instead of JAX's (`var_type`), or None
        self.types: Mapping[Any, SpmdType] | None = None

    def defining(self, v: Any) -> Any:
        """The equation of the jaxpr walked (`eqns`) that defines the value `v`, or None (an
        input, a constant). (Read rarely, by a reduction's residual check: the map is built on
        first use rather than written at every equation.)"""
        defs = self._defs
        if defs is None:
            defs = self._defs = {o: e for e in self.eqns for o in e.outvars}
        return defs.get(v)

    def export(self, v: Any) -> tuple[Any, ...]:
        """The facts of `v`, to seed the matching variable of a nested jaxpr (or the caller)."""
        if is_literal(v):
            return (True, self.is_zero(v), frozenset(), frozenset(), False, None)
        empty: frozenset[str] = frozenset()
        content = tuple(getattr(self, k).get(v, 0 if k == "lineage" else empty)
                        for k in CONTENT) + (self.summed.get(v, ()),)
        return (v in self.const, v in self.zero, self.scaled.get(v, frozenset()),
                self.bcast.get(v, frozenset()), v in self.grad, content)

    def signature(self, v: Any) -> tuple[Any, ...]:
        """Every fact of the value `v` (a `Var`) but its lineage and sums: equal for values
        the walk cannot tell apart (`transfer.key`)."""
        return (v in self.const, v in self.zero, self.scaled.get(v), self.bcast.get(v) or None,
                v in self.grad, self.same.get(v), self.gathered.get(v), self.sliced.get(v),
                self.accum.get(v), self.own.get(v), self.moved.get(v), self.unsure.get(v))

    def replayable(self, v: Any) -> tuple[tuple[str, Any], ...]:
        """The facts of `v` but its lineage and sums, as `(attribute, value)` pairs, the ones
        it has only (`restore` writes them for another value: `transfer`)."""
        got: list[tuple[str, Any]] = [(k, True) for k in _SETS if v in getattr(self, k)]
        for k in _DICTS:
            value = getattr(self, k).get(v)
            if value:
                got.append((k, value))
        return tuple(got)

    def restore(self, v: Any, facts: tuple[tuple[str, Any], ...]) -> None:
        """Write `facts` (`replayable`) for the value `v`."""
        for k, value in facts:
            if value is True:
                getattr(self, k).add(v)
            else:
                getattr(self, k)[v] = value

    def mark_grad(self, v: Any) -> None:
        """`v` is a gradient the body computes (`gradients.type_gradient`, after the equation
        that defines it: its `transfer.fact_id` is read again)."""
        self.grad.add(v)
        self.ids.pop(v, None)

    def seed(self, v: Any, facts: tuple[Any, ...]) -> None:
        const, zero, scaled, bcast, grad, content = facts
        for k, got in zip(CONTENT + ("summed",), content or (), strict=False):
            if got:
                getattr(self, k)[v] = got
        if const:
            self.const.add(v)
        if zero:
            self.zero.add(v)
        if scaled:
            self.scaled[v] = scaled
        if bcast:
            self.bcast[v] = bcast
        if grad:
            self.grad.add(v)

    def effective(self, v: Any, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        if is_literal(v):
            return ()
        dims = self.bcast.get(v, frozenset())
        n = len(shape)
        return tuple(1 if (d - n) in dims else s for d, s in enumerate(shape))

    def is_zero(self, v: Any) -> bool:
        if is_literal(v):
            try:
                return bool(float(v.val) == 0.0)
            except (TypeError, ValueError):
                return False
        return v in self.zero

    def is_constant(self, v: Any) -> bool:
        return is_literal(v) or v in self.const

    def prescaled(self, v: Any) -> frozenset[str]:
        return self.scaled.get(v, frozenset())

    def after_elementwise(self, eqn: Any, name: str) -> None:
        ins = eqn.invars
        outs = eqn.outvars
        if not outs:
            return
        o = outs[0]
        dims = None
        for v in ins:
            if is_literal(v):
                continue
            d = self.bcast.get(v, frozenset())
            dims = d if dims is None else dims & d
        if dims:
            self.bcast[o] = dims
        if all(self.is_constant(v) for v in ins):
            self.const.add(o)
        # `0.0 * b`: a term that keeps `b` in the program and adds nothing (JAX's tests write
        # it); added to a partial sum it is counted zero times, as it should be. Which ops
        # make a zero: `ZERO_FLOWS`, by the primitive's rule (the runtime's and the plugin's)
        if _r.zero_result(_rules.PRIMITIVES.get(name), [self.is_zero(v) for v in ins]):
            self.zero.add(o)


def track_side(side: Side, eqn: Any, name: str, sizes: dict[str, int]) -> None:
    """Side facts of the structural equations (called for every equation)."""
    ins, outs = eqn.invars, eqn.outvars
    if not outs:
        return
    if side.grad and any(not is_literal(v) and v in side.grad for v in ins):
        side.grad.update(outs)
    o = outs[0]
    if name == "broadcast_in_dim":
        shape, out_shape = shape_of(ins[0]), shape_of(o)
        bd = tuple(eqn.params["broadcast_dimensions"])
        n = len(out_shape)
        kept = {bd[i]: i for i in range(len(bd))}
        dims = set()
        src_b = side.bcast.get(ins[0], frozenset()) if not is_literal(ins[0]) else frozenset()
        for d in range(n):
            if d not in kept:
                dims.add(d - n)
            else:
                i = kept[d]
                if shape[i] == 1 and out_shape[d] != 1 or (i - len(shape)) in src_b:
                    dims.add(d - n)
        side.bcast[o] = frozenset(dims)
        if side.is_constant(ins[0]):
            side.const.add(o)
        if _r.zero_result(_rules.PRIMITIVES.get(name), [side.is_zero(ins[0])]):
            side.zero.add(o)
        if not is_literal(ins[0]) and side.prescaled(ins[0]):
            side.scaled[o] = side.prescaled(ins[0])
    elif name == "iota":
        side.const.add(o)
    elif name in ("pvary", "reduced_vary_cast"):
        for v, out in zip(ins, outs, strict=False):
            if side.is_constant(v):
                side.const.add(out)
            if side.is_zero(v):
                side.zero.add(out)
            if not is_literal(v):
                if side.prescaled(v):
                    side.scaled[out] = side.prescaled(v)
                if v in side.bcast:
                    side.bcast[out] = side.bcast[v]
    elif name in ("div", "mul") and len(ins) == 2:
        num, den = ins
        if is_literal(den) and not is_literal(num):
            try:
                val = float(den.val)
            except (TypeError, ValueError):
                return
            scale = val if name == "div" else (1.0 / val if val else 0.0)
            axes = frozenset(a for a, s in sizes.items() if s > 1 and abs(scale - s) < 1e-6)
            if axes:
                side.scaled[o] = axes | side.prescaled(num)
    elif name in ("reshape", "squeeze", "expand_dims", "transpose", "slice", "convert_element_type"):
        if ins and not is_literal(ins[0]):
            if side.is_constant(ins[0]):
                side.const.add(o)
            # uniform along the same dims: a slice or a cast keeps the rank and the dims; a
            # value uniform along every dim (a broadcast scalar: `ones(n * d)`) stays so
            uniform = side.bcast.get(ins[0])
            if uniform and name in ("slice", "convert_element_type"):
                side.bcast[o] = uniform
            elif uniform and len(uniform) == len(shape_of(ins[0])):
                side.bcast[o] = frozenset(range(-len(shape_of(o)), 0))
            # a zero cast is a zero (`ZERO_FLOWS`: astype; jax 0.12.1 casts the pvary'd
            # literal 0 of `jax.tree.reduce(operator.add, sums, initializer=0)` to float)
            if _r.zero_result(_rules.PRIMITIVES.get(name), [side.is_zero(ins[0])]):
                side.zero.add(o)
            if side.prescaled(ins[0]):
                side.scaled[o] = side.prescaled(ins[0])



def cut_from_a_table(side: Side, eqn: Any) -> bool:
    """Whether the `slice` equation `eqn` shortens a dim along which a constant built in the
    program varies: a table computed from `iota` for a longer extent (RoPE's cos / sin for
    the whole sequence, cut to the local length `table[:n]`). Its values depend on where it
    was cut, as a replicated input's would, so it carries data (`Refinement.data`): laid along
    a dim another operand has sharded it is SPMD215, as `sinks[:h]` of an input is. A constant
    known uniform along the dim (a broadcast: zeros, ones, `full`) or zero is not."""
    v = eqn.invars[0]
    if is_literal(v) or v not in side.const or v in side.zero:
        return False
    shape, cut = shape_of(v), shape_of(eqn.outvars[0])
    uniform, n = side.bcast.get(v, frozenset()), len(shape)
    return any(a != b and d - n not in uniform
               for d, (a, b) in enumerate(zip(shape, cut, strict=True)))


def constant_share(name: str, values: Sequence[object], axis_sizes: Mapping[str, int]
                   ) -> tuple[int, tuple[str, ...]] | None:
    """`(i, axes)` when `div` / `mul` divides operand `i` by the size of `axes` (`values`: each
    operand's scalar constant, or None): a constant equal to the size of one group of mesh
    axes (`b / jax.lax.axis_size("tp")`, `b / 4`, `b * 0.25` on tp=4), the raw spelling of
    `b / st.axis_size("tp")` (the typed runtime knows the axes; here the number decides, and
    only when one group has it)."""
    if name not in ("div", "mul") or len(values) != 2:
        return None
    for i in (0, 1) if name == "mul" else (0,):
        value = values[1 - i]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not value:
            continue
        n = value if name == "div" else 1 / value
        sized = sorted(a for a, size in axis_sizes.items() if size > 1)
        groups = [g for k in range(1, len(sized) + 1) for g in itertools.combinations(sized, k)
                  if abs(math.prod(axis_sizes[a] for a in g) - n) < 1e-6]
        if len(groups) == 1:
            return i, groups[0]
    return None


def dynamic_slice_ref(ins: Sequence[Any], refs: Sequence[Refinement], out: SpmdType,
                      shapes: Sequence[tuple[int, ...]], sizes: tuple[int, ...]) -> Refinement:
    """A full dim keeps a Shard, a partial slice drops it (and Rep / Partial where the offset
    varies); slicing a replicated value at an offset made from `axis_index(a)` gives Shard(a)
    on that dim (rule 1)."""
    shape = shapes[0]
    items = ["slice:full" if sz == n else "slice:part" for sz, n in zip(sizes, shape, strict=True)]
    # (Rep / Partial dropped where an offset of a cut dim varies: each device cuts elsewhere)
    moved = frozenset().union(*(t.varying for d, t in enumerate(ins[1:])
                                if t is not LITERAL and sizes[d] != shape[d]))
    res = _rs.index(ins[0], refs[0], out, len(shape), items, len(shape)).shards_only(moved) \
        .as_dict()
    for d, (idx_t, idx_r) in enumerate(zip(ins[1:], refs[1:], strict=False)):
        if sizes[d] == shape[d] or idx_t is LITERAL:
            continue
        for a in out.varying:
            if _r.kind(idx_t, idx_r, a) is INDEX and _r.kind(ins[0], refs[0], a) in (FIXED, REP):
                res[a] = Shard(d - len(shape))
    return Refinement.of(res, refs[0].data)


def gather_ref(ins: Sequence[Any], refs: Sequence[Refinement], out: SpmdType,
               shapes: Sequence[tuple[int, ...]], out_shape: tuple[int, ...], p: Any) -> Refinement:
    """An array index drops Shards; a replicated value gathered at indices made from
    `axis_index(a)` (`jnp.take(t, axis_index * n + arange(n))`) is Shard(a) there. Indices
    replicated over an axis that pick along a dim sharded over it are SPMD215
    (`refine.indexed_along_shard`: global ids into a local shard)."""
    dnums = p.get("dimension_numbers")
    traced = len(ins) > 1 and ins[1] is not LITERAL   # the indices: a traced operand
    if traced:
        shape, sizes = shapes[0], tuple(p.get("slice_sizes") or ())
        picked = [d - len(shape) for d in tuple(getattr(dnums, "start_index_map", ()) or ())
                  if d < len(sizes) and sizes[d] < shape[d]]
        if picked:
            _r.indexed_along_shard(_r.Arg(ins[0], refs[0]), picked, _r.Arg(ins[1], refs[1]),
                                   "gather")
    # (Rep / Partial kept only where the indices are the same on every device: indices that
    # vary pick other elements on each device, as for `jnp.take`)
    res = _rs.index(ins[0], refs[0], out, len(shapes[0]), ["array"], len(out_shape),
                    index_varying=ins[1].varying if traced else ()).as_dict()
    offset = tuple(getattr(dnums, "offset_dims", ()) or ())
    batch = [d for d in range(len(out_shape)) if d not in offset]
    if len(batch) == 1 and traced:
        for a in out.varying:
            if _r.kind(ins[1], refs[1], a) is INDEX \
                    and _r.kind(ins[0], refs[0], a) in (FIXED, REP):
                res[a] = Shard(batch[0] - len(out_shape))
    return Refinement.of(res, refs[0].data)


def in_refinements(specs: Sequence[Any], avals: Sequence[Any], manual: Sequence[str]) -> list[Refinement]:
    """The refinement of each shard_map input from its in_spec (`refine_shape.from_spec`),
    read once per distinct spec and rank (a program's layers repeat theirs)."""
    out = []
    seen: dict[tuple[Any, ...], Refinement] = {}
    for spec, aval in zip(specs, avals, strict=True):
        ndim = len(getattr(aval, "shape", ()) or ())
        entries = getattr(spec, "partitions", None)
        entries = tuple(entries) if entries is not None else tuple(spec or ())
        try:
            got = seen.get((entries, ndim))
        except TypeError:   # an entry that is not hashable
            got = None
        if got is None:
            got = _rs.from_spec(entries, ndim, manual)
            with contextlib.suppress(TypeError):
                seen[(entries, ndim)] = got
        out.append(got)
    return out
