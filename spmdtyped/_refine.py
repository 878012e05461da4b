"""The refinement of Varying: Shard(axis, dim), Partial(axis) and Rep (DESIGN.md §1b).

JAX's four states cannot tell a *slice of a global array* from a value that merely differs
per device, nor see that contracting a sharded dimension makes *partial sums*. Per axis on
which a value is Varying, this module tracks one of:

- `Shard(d)`  -- the value is the device's slice of a global array along local dim `d`
  (counted from the right, `-1` is the last dim: right-aligned broadcasting keeps it fixed);
- `PARTIAL`   -- the value is one device's term of a sum over the axis (`h @ w2` with the
  contracted dim sharded on both sides); the true value is the psum;
- `REP`       -- the value is equal on every device (a `pvary` of an Invariant value);
- `INDEX`     -- `axis_index(axis)` (and integer arithmetic of it);
- `ONEHOT`    -- a predicate true on exactly one device of the axis (`axis_index(a) == c`).

An axis with no entry is *plain* Varying: the fallback whenever a dimension cannot be
followed, never a new error. JAX keeps seeing Varying; nothing here changes what is bound.

Pure data and functions: no JAX, no mypy. Every function takes the four-state result the
rule table already computed (`out`), so the refinement only ever *adds* knowledge on the
axes `out` is Varying on, and raises only for the bug classes it is built to catch.
Shapes are local (per-device) shapes; `None` means unknown (the static checker without dims),
in which case every dim-dependent rule falls back to plain.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Union

from ._errors import error
from ._rules import LITERAL, Operand, SpmdType

# ---------------------------------------------------------------------------------------------
# Kinds


@dataclasses.dataclass(frozen=True, order=True)
class Shard:
    """The device's slice of a global array along local dim `dim` (negative: from the right)."""

    dim: int

    def __str__(self) -> str:
        return f"Shard({self.dim})"


class _Tag(str):
    __slots__ = ()


PARTIAL = _Tag("Partial")
REP = _Tag("Rep")
INDEX = _Tag("Index")
ONEHOT = _Tag("OneHot")

Kind = Union[Shard, _Tag]
#: the per-axis kind of an operand, as the rules see it: a Kind, "plain" Varying, or "fixed"
#: (not Varying on the axis: Invariant, Reduced -- equal on every device -- or Unreduced)
PLAIN = "plain"
FIXED = "fixed"


@dataclasses.dataclass(frozen=True)
class Refinement:
    """Per axis, what a Varying value is. Hashable (a pytree aux datum); empty = all plain."""

    items: tuple[tuple[str, Kind], ...] = ()

    @staticmethod
    def of(mapping: Mapping[str, Kind | None]) -> Refinement:
        return Refinement(tuple(sorted((a, k) for a, k in mapping.items() if k is not None)))

    def get(self, axis: str) -> Kind | None:
        for a, k in self.items:
            if a == axis:
                return k
        return None

    def as_dict(self) -> dict[str, Kind]:
        return dict(self.items)

    def restrict(self, varying: Iterable[str]) -> Refinement:
        keep = frozenset(varying)
        return Refinement(tuple((a, k) for a, k in self.items if a in keep))

    def __bool__(self) -> bool:
        return bool(self.items)

    def __str__(self) -> str:
        return ", ".join(f"{k}[{a!r}]" for a, k in self.items) or "plain"


NONE = Refinement()


def kind(t: Operand, ref: Refinement, axis: str) -> Kind | str:
    """The per-axis kind of an operand: a Kind, PLAIN, or FIXED (a literal is FIXED)."""
    if t is LITERAL or not isinstance(t, SpmdType) or axis not in t.varying:
        return FIXED
    k = ref.get(axis)
    return PLAIN if k is None else k


def describe(t: SpmdType, ref: Refinement) -> str:
    """`Typed[Shard['tp', -1], Varying['dp']]`-style text of a refined type."""
    if not ref:
        return str(t)
    parts = []
    for a, k in ref.items:
        parts.append(f"Shard[{a!r}, {k.dim}]" if isinstance(k, Shard) else f"{k}[{a!r}]")
    rest = SpmdType(t.varying - {a for a, _ in ref.items}, t.unreduced, t.reduced, t.unreduced_kind)
    if rest.axes:
        parts.append(str(rest))
    return parts[0] if len(parts) == 1 else f"Typed[{', '.join(parts)}]"


# ---------------------------------------------------------------------------------------------
# Shapes and dims


def neg_dim(d: int, ndim: int) -> int:
    """A dim as counted from the right (-1 = last)."""
    return d - ndim if d >= 0 else d


def _dims(axis: int | Sequence[int] | None, ndim: int) -> frozenset[int]:
    if axis is None:
        return frozenset(range(-ndim, 0))
    if isinstance(axis, int):
        return frozenset({neg_dim(axis, ndim)})
    return frozenset(neg_dim(a, ndim) for a in axis)


def _size(shape: Sequence[int] | None, d: int) -> int | None:
    if shape is None or -d > len(shape):
        return None
    return shape[d]


# ---------------------------------------------------------------------------------------------
# Errors (codes SPMD21x: CombineError, SPMD108: AxisStateError, SPMD407: BoundaryError)


def _partial_fix(axis: str) -> str:
    return f"reduce first: st.psum(x, {axis!r}), then apply the op"


def _fail(code: str, op: str, headline: str, axis: str, t: SpmdType | None, fix: str,
          details: Sequence[str] = ()) -> Exception:
    return error(code, f"{op}: {headline}", axes=(axis,),
                 states={axis: "varying (partial sums)" if code != "SPMD108" else "varying (shard)"},
                 op=op, fix=fix, details=tuple(details))


# ---------------------------------------------------------------------------------------------
# Elementwise ops (with right-aligned broadcasting)

#: how each elementwise rule name treats a Partial operand
ADDITIVE = frozenset({"add", "sub", "concatenate", "stack"})
SCALING = frozenset({"mul"})
DIVIDING = frozenset({"div"})
SELECTING = frozenset({"where"})
#: unary ops that are linear in their input (keep Partial): everything else that is not
#: structural rejects a Partial input (non-linear)
LINEAR_UNARY = frozenset({"neg", "copy", "conj", "stop_gradient", "real", "imag", "astype",
                          "pad", "tile", "repeat", "cumsum", "flip", "roll", "getitem",
                          "dynamic_slice", "broadcast_to", "expand_dims", "squeeze",
                          "reshape", "transpose", "swapaxes", "moveaxis", "ravel", "split",
                          "at_add"})


@dataclasses.dataclass(frozen=True)
class Arg:
    """One operand of an elementwise op: its four-state type (or LITERAL), refinement, shape."""

    type: Operand
    ref: Refinement = NONE
    shape: tuple[int, ...] | None = None


def _aligned_shard(args: Sequence[Arg], axis: str, out_ndim: int | None) -> Kind | str:
    """The join of Shard/Rep/FIXED operands on one axis after broadcasting: Shard(d) if every
    sharded operand is sharded on the same (right-aligned) dim d and no other operand has a
    non-1 extent there that is itself varying differently; REP if all are REP/FIXED; else PLAIN."""
    shards = {kind(x.type, x.ref, axis) for x in args} - {FIXED}
    if not shards:
        return FIXED
    if shards <= {REP}:
        return REP
    dims = {k.dim for k in shards if isinstance(k, Shard)}
    if len(dims) != 1 or not shards <= ({REP} | {Shard(d) for d in dims}):
        return PLAIN
    (d,) = dims
    if out_ndim is not None and -d > out_ndim:
        return PLAIN
    # a REP operand with a non-1 extent along the sharded dim is the same slice on every
    # device next to different slices: keep the Shard (it is x + tile(b)), as for FIXED ones
    return Shard(d)


def elementwise(name: str, args: Sequence[Arg], out: SpmdType, *, op: str,
                out_ndim: int | None = None, onehot_fill: bool = False) -> Refinement:
    """The refinement of an elementwise op's result (`out` is the four-state result).

    `onehot_fill`: for `where`, the unselected branch is a literal 0 (the owner mask).
    """
    result: dict[str, Kind | None] = {}
    for a in sorted(out.varying):
        ks = [kind(x.type, x.ref, a) for x in args]
        result[a] = _elementwise_axis(name, args, ks, a, out, op, out_ndim, onehot_fill)
    return Refinement.of(result)


def _elementwise_axis(name: str, args: Sequence[Arg], ks: list[Kind | str], a: str,
                      out: SpmdType, op: str, out_ndim: int | None,
                      onehot_fill: bool) -> Kind | None:
    n = len(args)
    has_p = [i for i, k in enumerate(ks) if k is PARTIAL]
    if name in SELECTING and n == 3:
        pred, on_true, on_false = ks
        if has_p and pred not in (FIXED, REP):
            raise _fail("SPMD213", op, f"the predicate varies over {a!r} and a branch is a partial "
                        f"sum there: selecting per device mixes terms of different sums", a, None,
                        fix=f"reduce the branch first (st.psum(x, {a!r})), or make the predicate "
                            f"uniform over {a!r}")
        if pred is ONEHOT and onehot_fill and on_true in (FIXED, REP):
            return PARTIAL  # where(axis_index(a) == c, x, 0): the owner's term of x
        if has_p:
            if on_true is PARTIAL and (on_false is PARTIAL or onehot_fill):
                return PARTIAL  # masking a partial sum with a uniform predicate: linear
            return None
        joined = _aligned_shard(args, a, out_ndim)
        return None if joined in (PLAIN, FIXED) else joined  # type: ignore[return-value]
    if has_p:
        others = [k for i, k in enumerate(ks) if i not in has_p]
        if n == 1:
            if name in LINEAR_UNARY:
                return PARTIAL
            raise _fail("SPMD211", op, f"{name} is not linear, but the value is a partial sum "
                        f"over {a!r} (its true value is the psum)", a, None, fix=_partial_fix(a))
        if name in ADDITIVE:
            if all(k is PARTIAL for k in ks):
                return PARTIAL
            if any(k in (FIXED, REP) for k in others):
                j = next(i for i, k in enumerate(ks) if k in (FIXED, REP))
                what = "a literal" if args[j].type is LITERAL else (
                    "a replicated value" if ks[j] is REP else "an Invariant value")
                raise _fail("SPMD210", op, f"a partial sum over {a!r} is combined with {what}: the "
                            f"replicated term would be counted once per device when the partial "
                            f"sums are reduced (e.g. a bias added before the reduction)", a, None,
                            fix=f"st.psum(x, {a!r}) {'+' if name == 'add' else '-'} b   "
                                f"(reduce first, then add the replicated term)")
            return None  # Partial +- plain / Shard: nothing can be followed
        if name in SCALING:
            if len(has_p) > 1:
                raise _fail("SPMD211", op, f"both operands are partial sums over {a!r}: the product "
                            f"of partial sums is not the partial sum of the product", a, None,
                            fix=_partial_fix(a))
            return PARTIAL if all(k in (FIXED, REP) for k in others) else None
        if name in DIVIDING:
            if n == 2 and ks[1] is PARTIAL:
                raise _fail("SPMD212", op, f"the divisor is a partial sum over {a!r}: each device "
                            f"divides by its local term instead of the total (e.g. a normaliser "
                            f"or token count computed over a shard)", a, None,
                            fix=f"x / st.psum(d, {a!r})  (reduce the divisor first)")
            return PARTIAL if all(k in (FIXED, REP) for k in others) else None
        raise _fail("SPMD211", op, f"{name} is not linear, but an operand is a partial sum over "
                    f"{a!r} (its true value is the psum)", a, None, fix=_partial_fix(a))
    if n == 1:
        (k,) = ks
        if k is INDEX:
            return INDEX if name in ("neg", "copy", "astype") else None
        return k if isinstance(k, Shard) or k is REP else None
    # INDEX == c (or c == INDEX) is the owner predicate
    if name in ("eq",) and n == 2 and sorted(map(str, ks)) == sorted(map(str, [INDEX, FIXED])):
        return ONEHOT
    if INDEX in ks:
        if name in ("add", "sub", "mul", "floordiv", "mod") and all(k in (INDEX, FIXED) for k in ks):
            return INDEX
        return None
    if ONEHOT in ks:
        if name in ("and", "mul") and all(k in (ONEHOT, FIXED, REP) for k in ks):
            return ONEHOT if name == "and" else None
        return None
    joined = _aligned_shard(args, a, out_ndim)
    return None if joined in (PLAIN, FIXED) else joined  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Reductions over local dims


#: reductions that are sums (a Shard dim summed gives a Partial)
SUMS = frozenset({"sum"})
#: order-dependent or non-linear reductions: a Shard dim reduced gives plain
OTHER_REDUCTIONS = frozenset({"max", "min", "argmax", "argmin", "prod", "mean", "var", "std",
                              "any", "all", "logsumexp", "norm"})


def _drop_dims(k: Kind, removed: frozenset[int]) -> Kind | None:
    """A Shard's dim after `removed` (negative dims) are dropped (keepdims=False)."""
    if not isinstance(k, Shard):
        return k
    if k.dim in removed:
        return None
    # dims to the right of the shard that are removed shift it right
    return Shard(k.dim + sum(1 for r in removed if r > k.dim))


def reduction(name: str, t: SpmdType, ref: Refinement, out: SpmdType, *, ndim: int | None,
              axis: int | Sequence[int] | None, keepdims: bool = False, op: str) -> Refinement:
    """`x.sum(axis)` and friends: summing a Shard dim makes a Partial; other reductions of a
    Shard dim give plain; a Partial stays Partial under `sum`, is an error under non-linear
    reductions (max of partial sums is not the partial sum of maxes)."""
    result: dict[str, Kind | None] = {}
    removed = _dims(axis, ndim) if ndim is not None else None
    for a in sorted(out.varying):
        k = kind(t, ref, a)
        if k is PARTIAL:
            if name in SUMS or name == "mean":
                # the mean of partial sums over local dims divides by a replicated count: linear
                result[a] = PARTIAL
                continue
            raise _fail("SPMD211", op, f"{name} is not linear, but the value is a partial sum over "
                        f"{a!r}", a, None, fix=_partial_fix(a))
        if isinstance(k, Shard):
            if removed is None:
                result[a] = None
            elif k.dim in removed:
                result[a] = PARTIAL if name in SUMS else None
            else:
                result[a] = k if keepdims else _drop_dims(k, removed)
        elif k is REP:
            result[a] = REP
        else:
            result[a] = None
    return Refinement.of(result)


def along_dim(name: str, t: SpmdType, ref: Refinement, out: SpmdType, *, ndim: int | None,
              axis: int | None, op: str) -> Refinement:
    """`cumsum`/`sort`/`flip`/`roll`/`take`/`argsort` along one dim (or flattened): a Shard on
    that dim gives plain (the op would need the other devices' slices); elsewhere kept. A
    Partial is kept by the linear ones (cumsum, flip, roll, take) and rejected by sort."""
    result: dict[str, Kind | None] = {}
    dims = _dims(axis, ndim) if ndim is not None else None
    for a in sorted(out.varying):
        k = kind(t, ref, a)
        if k is PARTIAL:
            if name in LINEAR_UNARY or name == "take":
                result[a] = PARTIAL
                continue
            raise _fail("SPMD211", op, f"{name} is not linear, but the value is a partial sum over "
                        f"{a!r}", a, None, fix=_partial_fix(a))
        if isinstance(k, Shard):
            result[a] = k if dims is not None and k.dim not in dims and axis is not None else None
        elif k is REP:
            result[a] = REP
        else:
            result[a] = None
    return Refinement.of(result)


# ---------------------------------------------------------------------------------------------
# Contractions


def _einsum_parse(spec: str, n: int) -> tuple[list[str], str] | None:
    spec = spec.replace(" ", "")
    if "." in spec:
        return None
    if "->" in spec:
        ins, out = spec.split("->")
    else:
        ins = spec
        letters = [c for c in ins.replace(",", "")]
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    parts = ins.split(",")
    if len(parts) != n:
        return None
    return parts, out


def einsum(spec: str, args: Sequence[Arg], out: SpmdType, *, op: str) -> Refinement:
    """The refinement of `einsum(spec, *operands)` (and of matmul/dot via `matmul_spec`).

    Per axis: a letter sharded in every operand that has it, summed away -> Partial; a letter
    sharded where it survives -> Shard of the output's dim; Partial times replicated operands
    -> Partial; two Partials -> error (product of partial sums); anything else -> plain.
    """
    parsed = _einsum_parse(spec, len(args))
    result: dict[str, Kind | None] = {}
    for a in sorted(out.varying):
        ks = [kind(x.type, x.ref, a) for x in args]
        ps = [i for i, k in enumerate(ks) if k is PARTIAL]
        if len(ps) > 1:
            raise _fail("SPMD211", op, f"two operands are partial sums over {a!r}: the product of "
                        f"partial sums is not the partial sum of the product", a, None,
                        fix=_partial_fix(a))
        if ps:
            result[a] = PARTIAL if all(k in (FIXED, REP) for i, k in enumerate(ks) if i not in ps) \
                else None
            continue
        if all(k in (FIXED, REP) for k in ks):
            result[a] = REP
            continue
        if parsed is None or any(k not in (FIXED, REP) and not isinstance(k, Shard) for k in ks):
            result[a] = None
            continue
        ins, outs = parsed
        letters: set[str] = set()
        ok = True
        for sub, k in zip(ins, ks, strict=True):
            if isinstance(k, Shard):
                if -k.dim > len(sub):
                    ok = False
                    break
                letters.add(sub[k.dim])
        if not ok or len(letters) != 1:
            result[a] = None
            continue
        (c,) = letters
        # every operand that has letter c must be sharded on it (else shards meet a full dim)
        if any(c in sub and not (isinstance(k, Shard) and sub[k.dim] == c)
               for sub, k in zip(ins, ks, strict=True)):
            result[a] = None
            continue
        if c in outs:
            result[a] = Shard(outs.index(c) - len(outs))
        else:
            result[a] = PARTIAL
    return Refinement.of(result)


def matmul_spec(lhs_ndim: int, rhs_ndim: int) -> str:
    """The einsum spelling of `lhs @ rhs` (numpy's matmul broadcasting rules)."""
    letters = "abcdefghijklmnopqrstuvw"
    if lhs_ndim == 1 and rhs_ndim == 1:
        return "z,z->"
    if lhs_ndim == 1:
        batch = letters[: rhs_ndim - 2]
        return f"z,{batch}zy->{batch}y"
    if rhs_ndim == 1:
        batch = letters[: lhs_ndim - 2]
        return f"{batch}xz,z->{batch}x"
    nb = max(lhs_ndim, rhs_ndim) - 2
    batch = letters[:nb]
    lb, rb = batch[nb - (lhs_ndim - 2):], batch[nb - (rhs_ndim - 2):]
    return f"{lb}xz,{rb}zy->{batch}xy"


# ---------------------------------------------------------------------------------------------
# Structural ops


def transpose(t: SpmdType, ref: Refinement, perm: Sequence[int] | None, ndim: int) -> Refinement:
    perm = list(perm) if perm is not None else list(reversed(range(ndim)))
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        if isinstance(k, Shard):
            src = k.dim + ndim
            result[a] = Shard(perm.index(src) - ndim) if src in perm else None
        else:
            result[a] = k
    return Refinement.of(result).restrict(t.varying)


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
                result[a] = Shard(real_new[0] - len(new))
            elif real_old[0] == src and len(real_new) == 1:   # a merge with the shard outermost
                result[a] = Shard(real_new[0] - len(new))
            break
    return Refinement.of(result).restrict(t.varying)


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
    return Refinement.of(result).restrict(t.varying)


def squeeze(t: SpmdType, ref: Refinement, ndim: int, dims: Sequence[int]) -> Refinement:
    removed = frozenset(neg_dim(d, ndim) for d in dims)
    return Refinement.of({a: _drop_dims(k, removed) for a, k in ref.items}).restrict(t.varying)


def dims_unknown(t: SpmdType, ref: Refinement, out: SpmdType) -> Refinement:
    """A structural op whose dims cannot be followed (the static checker without shapes: a
    reshape, a transpose of unknown rank, ...): Partial and Rep survive (the op is linear and
    the same on every device), a Shard falls back to plain."""
    return Refinement.of({a: (None if isinstance(k, Shard) else k) for a, k in ref.items
                          if k in (PARTIAL, REP) or isinstance(k, Shard)}).restrict(out.varying)


#: an index item, as the runtime describes it: "int" (a constant), "slice:full",
#: "slice:part", "none" (newaxis), "ellipsis", "array" (a gather)
IndexItem = str


def index(t: SpmdType, ref: Refinement, out: SpmdType, ndim: int, items: Sequence[IndexItem],
          out_ndim: int) -> Refinement:
    """`x[...]` with static items: a constant index or partial slice on a Shard dim drops the
    Shard; full slices keep it; `None` inserts dims; an array index gives plain for Shards."""
    if any(i == "array" for i in items):
        return Refinement.of({a: (k if k in (REP, PARTIAL) else None) for a, k in ref.items}
                             ).restrict(out.varying)
    n_ell = items.count("ellipsis")
    consumed = sum(1 for i in items if i in ("int", "slice:full", "slice:part"))
    expanded: list[IndexItem] = []
    for i in items:
        if i == "ellipsis":
            expanded.extend(["slice:full"] * (ndim - consumed))
        else:
            expanded.append(i)
    if not n_ell:
        expanded.extend(["slice:full"] * (ndim - consumed))
    # map each input dim to its output dim (or None when dropped/cut)
    mapping: dict[int, int | None] = {}
    src = dst = 0
    for i in expanded:
        if i == "none":
            dst += 1
            continue
        if i == "int":
            mapping[src] = None
            src += 1
        else:
            mapping[src] = dst if i == "slice:full" else None
            src += 1
            dst += 1
    result: dict[str, Kind | None] = {}
    for a, k in ref.items:
        if isinstance(k, Shard):
            d = mapping.get(k.dim + ndim)
            result[a] = Shard(d - out_ndim) if d is not None else None
        else:
            result[a] = k
    return Refinement.of(result).restrict(out.varying)


def concatenate(args: Sequence[Arg], out: SpmdType, *, axis: int, out_ndim: int, op: str,
                stack: bool = False) -> Refinement:
    """Concatenating along a Shard dim gives plain; elsewhere shards must align. Partials
    concatenate with Partials only (a replicated part would be counted once per device)."""
    result: dict[str, Kind | None] = {}
    d_cat = neg_dim(axis, out_ndim)
    for a in sorted(out.varying):
        ks = [kind(x.type, x.ref, a) for x in args]
        if PARTIAL in ks:
            if all(k is PARTIAL for k in ks):
                result[a] = PARTIAL
                continue
            if any(k in (FIXED, REP) for k in ks):
                raise _fail("SPMD210", op, f"a partial sum over {a!r} is joined with a replicated "
                            f"part: that part would be counted once per device when reduced", a,
                            None, fix=f"st.psum the partial part over {a!r} first")
            result[a] = None
            continue
        j = _aligned_shard(args, a, None if stack else out_ndim)
        if isinstance(j, Shard):
            if not stack:
                result[a] = None if j.dim == d_cat else j
            else:
                # the stacked dim is inserted at `axis` of the result: input dims at or right
                # of it keep their negative index, those left of it move one further left
                in_ndim = out_ndim - 1
                src = j.dim + in_ndim
                pos = d_cat + out_ndim
                result[a] = Shard((src if src < pos else src + 1) - out_ndim)
        else:
            result[a] = REP if j is REP else None
    return Refinement.of(result)


# ---------------------------------------------------------------------------------------------
# Collectives and casts


def collective(name: str, t: SpmdType, ref: Refinement, out: SpmdType, axes: Sequence[str], *,
               shape: tuple[int, ...] | None = None, op: str,
               params: Mapping[str, object] | None = None) -> Refinement:
    """The refinement after a collective or cast over `axes` (four-state result `out`)."""
    params = params or {}
    ndim = len(shape) if shape is not None else None
    result = dict(ref.as_dict())
    for a in axes:
        k = kind(t, ref, a)
        if name in ("psum", "pmean"):
            if isinstance(k, Shard) and (_size(shape, k.dim) or 0) > 1:
                raise error("SPMD108", f"{op} over {a!r}: the value is a shard of a global array "
                            f"along dim {k.dim} over {a!r}; summing different slices of it makes "
                            f"no sense (e.g. expert weights reduced over the expert axis, or a "
                            f"batch shard summed elementwise)", axes=(a,),
                            states={a: f"varying (Shard({k.dim}))"}, op=op,
                            fix=f"st.all_gather(x, {a!r}, axis={k.dim}, tiled=True) to assemble "
                                f"the array, or reduce over the axis the value is a partial sum "
                                f"on, or x.sum({k.dim}) first if a total is meant")
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
            tiled = bool(params.get("tiled", False))
            if k is PARTIAL or ndim is None or not tiled:
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
    return Refinement.of({a: k for a, k in result.items() if k is not None}).restrict(out.varying)


def axis_index(axes: Sequence[str]) -> Refinement:
    return Refinement.of({a: INDEX for a in axes}) if len(axes) == 1 else NONE


# ---------------------------------------------------------------------------------------------
# Boundary, autodiff, joins


def from_spec(partitions: Sequence[object], ndim: int, manual: Iterable[str]) -> Refinement:
    """An in_spec `P('dp', None, 'tp')` of a rank-`ndim` input: Shard on each named dim.

    An axis that names two dims is plain on both (a value with two dims sharded over one axis).
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
    return Refinement.of({a: Shard(neg_dim(ds[0], ndim)) if len(ds) == 1 else None
                          for a, ds in seen.items()})


def cotangent(ref: Refinement) -> Refinement:
    """The refinement of a cotangent: Rep <-> Partial swap, Shard(k) stays, Invariant stays."""
    swap = {REP: PARTIAL, PARTIAL: REP}
    return Refinement.of({a: swap.get(k, k) if isinstance(k, str) else k  # type: ignore[arg-type]
                          for a, k in ref.items if k not in (INDEX, ONEHOT)})


def join(a: Refinement, b: Refinement, varying: Iterable[str]) -> Refinement:
    """Loop carries and branch outputs: kept where both sides agree, plain elsewhere."""
    bd = b.as_dict()
    return Refinement.of({x: k for x, k in a.items if bd.get(x) == k}).restrict(varying)


def hint_refinement(shards: Mapping[str, int], partial: Iterable[str]) -> Refinement:
    """The refinement a hint declares (`st.Shard["tp", -1]`, `st.Partial["tp"]`)."""
    out: dict[str, Kind | None] = {a: Shard(d) for a, d in shards.items()}
    out.update({a: PARTIAL for a in partial})
    return Refinement.of(out)


def accepts(want: Refinement, have: Refinement, have_type: SpmdType) -> str | None:
    """Gradual dims: a Shard/Partial hint accepts plain Varying (unknown) and its own kind; it
    refuses another kind. Returns the reason a value does not fit, or None."""
    for a, k in want.items:
        got = have.get(a)
        if a not in have_type.varying:
            return f"this value is not varying over {a!r}, but the hint wants {k}"
        if got is None or got == k:
            continue
        return f"this value is {got} over {a!r}, but the hint wants {k}"
    return None
