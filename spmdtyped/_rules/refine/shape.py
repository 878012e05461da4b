"""The refinement of Varying, part 2: structural ops, collectives, the boundary, autodiff.

See `refine` for the kinds (Shard, PARTIAL, REP, INDEX, ONEHOT) and the elementwise,
reduction and contraction rules. Pure data and functions: no JAX, no mypy.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..caching import hashable_cache
from ..elementwise import LITERAL
from ..states import SpmdType
from . import (
    FIXED,
    INDEX,
    NONE,
    ONEHOT,
    PARTIAL,
    REP,
    Arg,
    Kind,
    Plain,
    Refinement,
    Shard,
    aligned_shard,
    drop_dims,
    fail,
    kind,
    neg_dim,
    per_axis,
)

# ---------------------------------------------------------------------------------------------
# Structural ops


def dims(shape: Iterable[Any]) -> tuple[int, ...]:
    """The extents of a shape as the rules take them: each an int, but a symbolic one
    (`jax.export`'s shape polymorphism, `2*b`: an object `int()` refuses) kept as it is. The
    rules compare extents for equality only, which JAX's dimension expressions decide
    structurally (`2*b == 2*b`; `2*b == 8` is False), so a rule that needs an equal extent
    does not fire on a symbolic one; a rule that orders extents raises JAX's error there,
    which the refinement walk lists as a gap (docs/refinement.md, "What is checked, what is
    not")."""
    out: list[Any] = []
    for d in shape:
        if type(d) is not int:
            try:
                d = int(d)
            except Exception:  # noqa: BLE001, S110 - a symbolic extent (any error of int())
                pass
        out.append(d)
    return tuple(out)


def transpose(t: SpmdType, ref: Refinement, perm: Sequence[int] | None, ndim: int) -> Refinement:
    perm = list(perm) if perm is not None else list(reversed(range(ndim)))
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        if isinstance(k, Shard):
            src = k.dim + ndim
            result[a] = Shard(perm.index(src) - ndim) if src in perm else None
        else:
            result[a] = k
    return Refinement.of(result, ref.data).restrict(t.varying)


def reshape(t: SpmdType, ref: Refinement, old: Sequence[int], new: Sequence[int]) -> Refinement:
    """A Shard survives a reshape on the outermost factor of a split, and a merge only if the
    sharded dim is outermost in the group and the others are unsharded (i.e. size-wise)."""
    groups = _reshape_groups(list(old), list(new))
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        if not isinstance(k, Shard):
            result[a] = k
            continue
        src = k.dim + len(old)
        result[a] = None
        if groups is None:
            continue
        for olds, news in groups:
            if src not in olds:
                continue
            real_old = [d for d in olds if old[d] != 1]
            real_new = [d for d in news if new[d] != 1]
            if old[src] == 1 or not real_new:
                break
            if len(real_old) == 1:       # a split (or 1:1): the outermost new factor
                # a size-1 new dim before it is ambiguous: a split whose outer factor has one
                # element per device (`(h_local * dh) -> (h_local=1, dh)`: the heads are
                # sharded) or a new axis (`n -> (1, n)`): plain
                if news[0] != real_new[0]:
                    break
                result[a] = Shard(real_new[0] - len(new))
            elif real_old[0] == src and len(real_new) == 1:   # a merge with the shard outermost
                result[a] = Shard(real_new[0] - len(new))
            break
    return Refinement.of(result, ref.data).restrict(t.varying)


def _reshape_groups(old: list[int], new: list[int]) -> list[tuple[list[int], list[int]]] | None:
    """Pairs of (old dims, new dims) with equal products, in order; None if sizes disagree."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(old) or j < len(new):
        go, gn = [], []
        po = pn = 1
        if i < len(old):
            go.append(i)
            po *= old[i]
            i += 1
        if j < len(new):
            gn.append(j)
            pn *= new[j]
            j += 1
        while po != pn:
            if po < pn and i < len(old):
                go.append(i)
                po *= old[i]
                i += 1
            elif pn < po and j < len(new):
                gn.append(j)
                pn *= new[j]
                j += 1
            else:
                return None
        groups.append((go, gn))
    return groups


def expand(t: SpmdType, ref: Refinement, old_ndim: int, new_dims: Sequence[int]) -> Refinement:
    """`expand_dims`/`x[None]`: new size-1 dims at positions `new_dims` of the result."""
    new_ndim = old_ndim + len(new_dims)
    pos = sorted(neg_dim(d, new_ndim) + new_ndim for d in new_dims)
    kept = [d for d in range(new_ndim) if d not in pos]
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        result[a] = Shard(kept[k.dim + old_ndim] - new_ndim) if isinstance(k, Shard) else k
    return Refinement.of(result, ref.data).restrict(t.varying)


def squeeze(t: SpmdType, ref: Refinement, ndim: int, dims: Sequence[int]) -> Refinement:
    removed = frozenset(neg_dim(d, ndim) for d in dims)
    return Refinement.of({a: drop_dims(k, removed) for a, k in ref.items}, ref.data).restrict(t.varying)


def dims_unknown(t: SpmdType, ref: Refinement, out: SpmdType) -> Refinement:
    """A structural op whose dims cannot be followed (the static checker without shapes: a
    reshape, a transpose of unknown rank, ...): Partial and Rep survive (the op is linear and
    the same on every device), a Shard falls back to plain."""
    return Refinement.of({a: k for a, k in ref.items if k in (PARTIAL, REP)},
                         ref.data).restrict(out.varying)


#: an index item, as the runtime describes it: "int" (a constant), "slice:full",
#: "slice:part", "none" (newaxis), "ellipsis", "array" (a gather)
IndexItem = str


def index_dims(ndim: int, items: Sequence[IndexItem]) -> tuple[dict[int, int | None], list[int | None]]:
    """Where `x[...]` with static items (no "array") puts each dim: input dim -> output dim
    (None when a constant index or a partial slice cuts it), and each item's output dim (None
    for a constant index and the ellipsis). Dims counted from the left."""
    consumed = sum(1 for i in items if i in ("int", "slice:full", "slice:part"))
    fill: list[tuple[int | None, IndexItem]] = [(None, "slice:full")] * (ndim - consumed)
    # the items with the ellipsis (or the end) expanded to full slices, each with its position
    expanded: list[tuple[int | None, IndexItem]] = []
    for n, i in enumerate(items):
        expanded += fill if i == "ellipsis" else [(n, i)]
    if "ellipsis" not in items:
        expanded += fill
    mapping: dict[int, int | None] = {}
    at: list[int | None] = [None] * len(items)
    src = dst = 0
    for pos, item in expanded:
        if item == "int":
            mapping[src] = None
            src += 1
            continue
        if pos is not None:
            at[pos] = dst
        if item != "none":
            mapping[src] = dst if item == "slice:full" else None
            src += 1
        dst += 1
    return mapping, at


def index(t: SpmdType, ref: Refinement, out: SpmdType, ndim: int, items: Sequence[IndexItem],
          out_ndim: int, index_varying: Iterable[str] = ()) -> Refinement:
    """`x[...]` with static items: a constant index or partial slice on a Shard dim drops the
    Shard; full slices keep it; `None` inserts dims; an array index gives plain for Shards, and
    keeps Rep/Partial only where the index is the same on every device (`index_varying`: the
    axes a traced index varies on)."""
    if any(i == "array" for i in items):
        iv = frozenset(index_varying)
        return Refinement.of({a: (k if k in (REP, PARTIAL) and a not in iv else None)
                              for a, k in ref.items}, ref.data).restrict(out.varying)
    mapping, _ = index_dims(ndim, items)
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        if isinstance(k, Shard):
            d = mapping.get(k.dim + ndim)
            result[a] = Shard(d - out_ndim) if d is not None else None
        else:
            result[a] = k
    return Refinement.of(result, ref.data).restrict(out.varying)


def take(t: SpmdType, ref: Refinement, out: SpmdType, *, ndim: int, axis: int | None,
         index_ndim: int, index_varying: Iterable[str] = ()) -> Refinement:
    """`take(x, idx, axis)`: the gathered dim becomes the index's dims. A Shard on it (or any
    Shard when `axis` is None: a gather from the flattened array) gives plain; dims right of
    it keep their position from the right, dims left of it move by `index_ndim - 1`. Where the
    index varies, every kind becomes plain (each device picks other elements)."""
    iv = frozenset(index_varying)
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        if a in iv:
            result[a] = None
        elif isinstance(k, Shard):
            if axis is None:
                result[a] = None
                continue
            d = neg_dim(axis, ndim)
            result[a] = (None if k.dim == d else k if k.dim > d
                         else Shard(k.dim - (index_ndim - 1)))
        else:
            result[a] = k
    return Refinement.of(result, ref.data).restrict(out.varying)


def broadcast(t: SpmdType, ref: Refinement, old: Sequence[int], new: Sequence[int],
              *, uniform: bool = False) -> Refinement:
    """`broadcast_to`, `tile`, `repeat`, `pad`: the dims compared right-aligned; a Shard stays
    where its dim keeps its extent, else plain. Partial and Rep stay (these ops are linear and
    take the same data on every device). `uniform` (`broadcast_to`): the result is constant
    along the dims it broadcast (missing or size 1 before): `Refinement.uniform`."""
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        if isinstance(k, Shard):
            ok = -k.dim <= len(old) and -k.dim <= len(new) and old[k.dim] == new[k.dim] != 1
            result[a] = k if ok else None
        else:
            result[a] = k
    out = Refinement.of(result, ref.data).restrict(t.varying)
    if uniform:
        dims = tuple(d for d in range(-len(new), 0) if new[d] != 1 and (-d > len(old) or old[d] == 1))
        out = dataclasses.replace(out, uniform=dims)
    return out


def at_update(method: str, x: Arg, value: Arg, out: SpmdType) -> Refinement:
    """`x.at[i].<method>(v)` with a static index: Rep into Rep stays Rep; a Partial updated by
    `add`/`set` with a Partial, or `set` to a literal (zeroing entries is linear), stays
    Partial; a Shard is kept only when the update is a literal (the shape is unchanged).
    Everything else is plain: which slice the index hits cannot be followed."""
    def one(a: str) -> Kind | None:
        kx, kv = kind(x.type, x.ref, a), kind(value.type, value.ref, a)
        if kx is REP and kv in (FIXED, REP):
            return REP
        if kx is PARTIAL and (kv is PARTIAL and method in ("add", "set", "subtract")
                              or value.type is LITERAL and method in ("set", "multiply")):
            return PARTIAL
        if isinstance(kx, Shard) and value.type is LITERAL:
            return kx
        return None

    return Refinement.of(per_axis(out.varying, one), x.ref.data or value.ref.data)


def one_hot(t: SpmdType, ref: Refinement, out: SpmdType, *, op: str) -> Refinement:
    """`one_hot(x, n)`: non-linear in `x` (SPMD211 on a Partial), appends the class dim."""
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        if k is PARTIAL:
            try:
                raise fail("SPMD211", op, f"one_hot is not linear, but the value is a partial sum "
                           f"over {a!r}", a, None, fix=f"one_hot(st.psum(x, {a!r}), n)")
            except Plain:
                result[a] = None
        elif isinstance(k, Shard):
            result[a] = Shard(k.dim - 1)
        else:
            result[a] = k if k is REP else None
    return Refinement.of(result, ref.data).restrict(out.varying)


def concatenate(args: Sequence[Arg], out: SpmdType, *, axis: int, out_ndim: int, op: str,
                stack: bool = False) -> Refinement:
    """Concatenating along a Shard dim gives plain; elsewhere shards must align. Partials
    concatenate with Partials only (a replicated part would be counted once per device)."""
    d_cat = neg_dim(axis, out_ndim)

    def one(a: str) -> Kind | None:
        ks = [kind(x.type, x.ref, a) for x in args]
        if not stack and PARTIAL not in ks \
                and any(isinstance(k, Shard) and k.dim == d_cat for k in ks):
            return None  # along the Shard dim: pieces appended to a slice, nothing laid along it
        if PARTIAL in ks:
            if all(k is PARTIAL for k in ks):
                return PARTIAL
            if any(k in (FIXED, REP) or isinstance(k, Shard) for k in ks):
                raise fail("SPMD210", op, f"a partial sum over {a!r} is joined with a part that is "
                           f"not one: that part would be counted once per device when reduced", a,
                           None, fix=f"st.psum the partial part over {a!r} first")
            return None
        j = aligned_shard(args, a, None if stack else out_ndim, op)
        if not isinstance(j, Shard):
            return REP if j is REP else None
        if not stack:
            return None if j.dim == d_cat else j
        # the stacked dim is inserted at `axis` of the result: input dims left of it keep their
        # position from the left, the others move one to the right
        src = j.dim + out_ndim - 1
        pos = d_cat + out_ndim
        return Shard((src if src < pos else src + 1) - out_ndim)

    result = per_axis(out.varying, one)
    return Refinement.of(result, any(x.ref.data for x in args))


# ---------------------------------------------------------------------------------------------
# Collectives and casts


def collective(name: str, t: SpmdType, ref: Refinement, out: SpmdType, axes: Sequence[str], *,
               shape: tuple[int, ...] | None = None, op: str,
               params: Mapping[str, object] | None = None,
               strict_shards: bool = False) -> Refinement:
    """The refinement after a collective or cast over `axes` (four-state result `out`).

    A psum/pmean of a Shard over its own axis is SPMD108 for a gradient (`ref.grad`) only, or
    for every Shard with `strict_shards` (the plugin: a hint that names a sharded dim declares
    a slice of a global array, and it does not track gradients)."""
    params = params or {}
    ndim = len(shape) if shape is not None else None
    result: dict[str, Kind | None] = dict(ref.as_dict())
    across = set(ref.across)
    for a in axes:
        k = kind(t, ref, a)
        if name in ("psum", "pmean", "pmax", "pmin") and k != FIXED:
            across.add(a)
        if name in ("psum", "pmean"):
            # only for a gradient: a value sharded by its in_spec (or a hint) may as well be a
            # stack of per-device terms, whose psum is right (docs/design/shard_partial.md F5),
            # while the gradient of a Shard parameter is a slice of one array (the gradient of
            # this device's expert): summing the slices adds different parameters' gradients
            if isinstance(k, Shard) and (ref.grad or strict_shards):
                try:
                    what = "the gradient of a shard" if ref.grad else "a shard"
                    raise fail("SPMD108", op, f"the value is {what} of a global array along dim "
                               f"{k.dim} over {a!r}; summing different slices of it adds different "
                               f"parameters or rows elementwise (e.g. expert gradients reduced over "
                               f"the expert axis)", a, None,
                               fix=f"reduce over the axes the parameter is replicated on only "
                                   f"(not {a!r}); st.all_gather(x, {a!r}, axis={k.dim}, "
                                   f"tiled=True) to assemble the array")
                except Plain:
                    pass
            result.pop(a, None)
        elif name == "psum_scatter":
            dim = int(params.get("scatter_dimension", 0))  # type: ignore[call-overload]
            tiled = bool(params.get("tiled", False))
            result[a] = Shard(neg_dim(dim, ndim)) if (tiled and ndim is not None) else None  # type: ignore[assignment]
        elif name.startswith("all_gather"):
            dim = int(params.get("axis", 0))  # type: ignore[call-overload]
            tiled = bool(params.get("tiled", False))
            if name == "all_gather" and isinstance(k, Shard) and ndim is not None and tiled \
                    and neg_dim(dim, ndim) == k.dim:
                result[a] = REP
            elif name == "all_gather" and k is REP:
                result[a] = None
            else:
                result.pop(a, None)
        elif name == "all_to_all":
            split = int(params.get("split_axis", 0))  # type: ignore[call-overload]
            concat = int(params.get("concat_axis", split))  # type: ignore[call-overload]
            tiled = bool(params.get("tiled", False))
            if k is PARTIAL or ndim is None or not tiled or neg_dim(split, ndim) == neg_dim(concat, ndim):
                result.pop(a, None)
            else:
                result[a] = Shard(neg_dim(split, ndim))
        elif name in ("ppermute", "pshuffle", "pbroadcast"):
            result[a] = REP if k is REP else None  # type: ignore[assignment]
        elif name in ("pvary", "pcast_varying"):
            result[a] = REP  # an Invariant or Reduced value, now typed Varying: equal everywhere
        elif name in ("pmax", "pmin"):
            result.pop(a, None)
        else:  # pcast_unreduced, pcast_reduced, all_gather_invarying, ...
            result.pop(a, None)
    out_ref = Refinement.of({a: k for a, k in result.items() if k is not None}, True) \
        .restrict(out.varying).with_grad(ref.grad)
    return dataclasses.replace(out_ref, across=tuple(sorted(across))) if across else out_ref


def axis_index(axes: Sequence[str]) -> Refinement:
    return Refinement.of({a: INDEX for a in axes}) if len(axes) == 1 else NONE


# ---------------------------------------------------------------------------------------------
# Boundary, autodiff, joins


def from_spec(partitions: Sequence[object], ndim: int | None, manual: Iterable[str]) -> Refinement:
    """See `_from_spec` (read once per spec, rank and manual axes)."""
    return _from_spec(tuple(partitions), ndim, frozenset(manual))


@hashable_cache(1024)
def _from_spec(partitions: tuple[object, ...], ndim: int | None, manual: frozenset[str]
               ) -> Refinement:
    """An in_spec `P('dp', None, 'tp')` of a rank-`ndim` input: Shard on each named dim.

    An axis that names two dims is plain on both (a value with two dims sharded over one axis).
    `ndim` None (the static checker, a hint without dims): the dims stay counted from the left
    (`Shard(0)`, as a hint's `Shard["dp", 0]`), resolved once the rank is known (a spec may be
    shorter than the rank, so its length does not give the dims from the right).
    """
    manual = frozenset(manual)
    seen: dict[str, list[int]] = {}
    for d, entry in enumerate(partitions):
        if entry is None:
            continue
        names = (entry,) if isinstance(entry, str) else tuple(entry)  # type: ignore[arg-type]
        for a in names:
            if a in manual:
                seen.setdefault(a, []).append(d)
    return Refinement.of({a: (Shard(ds[0]) if ndim is None else Shard(neg_dim(ds[0], ndim)))
                          if len(ds) == 1 else None
                          for a, ds in seen.items()}, data=True)


@functools.lru_cache(maxsize=1024)
def cotangent(ref: Refinement) -> Refinement:
    """The refinement of a cotangent: Rep <-> Partial swap, Shard(k) stays, Invariant stays."""
    swap = {REP: PARTIAL, PARTIAL: REP}
    return Refinement.of({a: swap.get(k, k) if isinstance(k, str) else k  # type: ignore[arg-type]
                          for a, k in ref.items if k not in (INDEX, ONEHOT)}, ref.data) \
        .with_grad(True)


def join(a: Refinement, b: Refinement, varying: Iterable[str]) -> Refinement:
    """Loop carries and branch outputs: kept where both sides agree, plain elsewhere."""
    bd = b.as_dict()
    return Refinement.of({x: k for x, k in a.items if bd.get(x) == k}, a.data or b.data) \
        .restrict(varying).with_grad(a.grad or b.grad)


def hint_refinement(shards: Mapping[str, int], partial: Iterable[str] = (),
                    rep: Iterable[str] = ()) -> Refinement:
    """The refinement a hint declares (`st.Shard["tp", -1]`, `st.Partial["tp"]`, `st.Rep["tp"]`)."""
    out: dict[str, Kind | None] = {a: Shard(d) for a, d in shards.items()}
    out.update({a: PARTIAL for a in partial})
    out.update({a: REP for a in rep})
    return Refinement.of(out)


def accepts(want: Refinement, have: Refinement, have_type: SpmdType,
            ndim: int | None = None) -> str | None:
    """Gradual dims: a Shard/Partial hint accepts plain Varying (unknown) and its own kind; it
    refuses another kind, and a value that is not Varying on the axis. A hint's non-negative
    Shard dim counts from the left: it is resolved against `ndim` (the value's rank), and
    compared as unknown when the rank is not known. Returns the reason a value does not fit,
    or None."""
    for a, k in want.items:
        got = have.get(a)
        if isinstance(k, Shard) and k.dim >= 0:
            if ndim is None:
                if a in have_type.varying and isinstance(got, Shard):
                    continue  # a dim from the left against one from the right: unknown
            else:
                if k.dim >= ndim:
                    return f"this value has rank {ndim}, but the hint wants dim {k.dim} sharded"
                k = Shard(k.dim - ndim)
        if a not in have_type.varying:
            return f"this value is not varying over {a!r}, but the hint wants {k}"
        if got is None or got == k:
            continue
        return f"this value is {got} over {a!r}, but the hint wants {k}"
    return None
