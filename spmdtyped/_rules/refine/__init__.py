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
in which case every dim-dependent rule falls back to plain. The data (the kinds, `Refinement`)
is defined in `kinds` and re-exported here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from ..._errors import allowed, error
from ..elementwise import LITERAL, Operand
from ..states import SpmdType
from .kinds import DATA as DATA
from .kinds import FIXED as FIXED
from .kinds import INDEX as INDEX
from .kinds import NONE as NONE
from .kinds import ONEHOT as ONEHOT
from .kinds import PARTIAL as PARTIAL
from .kinds import PLAIN as PLAIN
from .kinds import REP as REP
from .kinds import Extent as Extent
from .kinds import Kind as Kind
from .kinds import LocalExtent as LocalExtent
from .kinds import Refinement as Refinement
from .kinds import Shard as Shard


def with_across(ref: Refinement, refs: Sequence[Refinement]) -> Refinement:
    """`ref` (an op's result) marked a reduction across the devices of the axes over which
    every operand that carries data is one (`x / (psum(x, a) ** 2 + 1)`: computed only from
    psum/pmean/pmax results, so nothing is laid along x's Shard dim, SPMD215)."""
    across = [set(r.across) for r in refs if r.data]
    common = set.intersection(*across) if across else set()
    return dataclasses.replace(ref, across=tuple(sorted(common))) if common else ref


def with_share(ref: Refinement, t: Operand, axes: Sequence[str]) -> Refinement:
    """The refinement of a replicated operand of type `t` divided by the size of `axes`: a
    share over `axes` when `t` is equal on every device there (Invariant or Rep)."""
    if not axes or any(kind(t, ref, a) not in (FIXED, REP) for a in axes):
        return ref
    return dataclasses.replace(ref, share=tuple(axes))


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


def dims_of(axis: int | Sequence[int] | None, ndim: int) -> frozenset[int]:
    if axis is None:
        return frozenset(range(-ndim, 0))
    if isinstance(axis, int):
        return frozenset({neg_dim(axis, ndim)})
    return frozenset(neg_dim(a, ndim) for a in axis)



# ---------------------------------------------------------------------------------------------
# Errors (codes SPMD21x: CombineError, SPMD108: AxisStateError, SPMD407: BoundaryError)


#: the codes the refinement raises (every one strict, with `st.allow(code)` as its opt-out)
CODES: tuple[str, ...] = ("SPMD108", "SPMD210", "SPMD211", "SPMD212", "SPMD213", "SPMD215",
                          "SPMD216")


def partial_fix(axis: str) -> str:
    return (f"reduce first: st.psum(x, {axis!r}), then apply the op (or st.local(x, {axis!r}) if "
            f"the value is local on purpose)")


def nonlinear(name: str, axis: str, op: str, *, what: str = "the value", why: str = "") -> Exception:
    """SPMD211: `name`, which is not linear, applied to a partial sum over `axis` (`what`)."""
    return fail("SPMD211", op, f"{name} is not linear, but {what} is a partial sum over {axis!r}{why}",
                axis, None, fix=partial_fix(axis))


class Plain(Exception):
    """An allowed refinement error (`st.allow(code)`): the axis falls back to plain Varying."""


def fail(code: str, op: str, headline: str, axis: str, t: SpmdType | None, fix: str,
          details: Sequence[str] = ()) -> Exception:
    if allowed(code):
        return Plain(code)
    state = {"SPMD108": "varying (a shard)", "SPMD215": "replicated along a shard",
             "SPMD216": "a diagonal block"}.get(
        code, "varying (partial sums)")
    return error(code, f"{op}: {headline}", axes=(axis,), states={axis: state}, op=op, fix=fix,
                 details=tuple(details))


def per_axis(axes: Iterable[str], fn: Callable[[str], Kind | None]) -> dict[str, Kind | None]:
    """`fn` for each axis; an allowed error makes that axis plain."""
    out: dict[str, Kind | None] = {}
    for a in sorted(axes):
        try:
            out[a] = fn(a)
        except Plain:
            out[a] = None
    return out


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
                          "at_add", "tril", "triu", "dynamic_slice_in_dim"})


@dataclasses.dataclass(frozen=True)
class Arg:
    """One operand of an elementwise op: its four-state type (or LITERAL), refinement, shape."""

    type: Operand
    ref: Refinement = NONE
    shape: tuple[Extent, ...] | None = None


def _extent(x: Arg, d: int) -> Extent:
    """The extent of operand `x` at dim `d` (from the right) after broadcasting: 1 where it has
    no such dim, None where its shape is unknown."""
    if x.shape is None:
        return None
    return x.shape[d] if -d <= len(x.shape) else 1


def _laid_along(ext: Extent, axis: str) -> bool:
    """Whether a replicated operand of extent `ext` lays different values along a dim sharded
    over `axis`: more than one element, or a local extent of a dim sharded over `axis`."""
    return ext > 1 if isinstance(ext, int) else isinstance(ext, LocalExtent) and axis in ext.axes


def _check_not_laid_along(x: Arg, d: int, axis: str, op: str) -> None:
    """SPMD215 when the replicated operand `x` lays different values along its dim `d`, which
    another operand has sharded over `axis`: it carries data (not a constant), is not uniform
    there, and is not a reduction across the devices of `axis`."""
    if _laid_along(_extent(x, d), axis) and x.ref.data and x.type is not LITERAL \
            and d not in x.ref.uniform and axis not in x.ref.across:
        raise fail("SPMD215", op, f"a replicated value is laid along dim {d}, which another "
                    f"operand has sharded over {axis!r}: every device applies the same "
                    f"values to a different slice (e.g. per-head parameters or positions "
                    f"built for the local shard)", axis, None,
                    fix=f"slice the replicated value by st.axis_index({axis!r}), or give it "
                        f"in_specs sharded over {axis!r} like the other operand")


def indexed_along_shard(x: Arg, dims: Iterable[int], index: Arg, op: str) -> None:
    """SPMD215 when an index that carries data and is replicated over an axis picks elements
    along a dim of `x` (`dims`, negative) that `x` has sharded over that axis: every device
    reads the same *local* positions of its own shard, so global indices (token ids, labels)
    land in the wrong shard. The vocabulary-parallel lookup takes `ids - axis_index * n`,
    which varies over the axis, masks the ids outside the shard and sums the parts; a
    constant index (`jnp.arange(n)`: local positions on purpose) is not data."""
    if index.type is LITERAL or not index.ref.data:
        return
    picked = frozenset(dims)
    for axis, k in x.ref.items:
        if isinstance(k, Shard) and k.dim in picked \
                and kind(index.type, index.ref, axis) in (FIXED, REP):
            err = fail("SPMD215", op, f"an index replicated over {axis!r} picks along dim "
                        f"{k.dim}, which the array has sharded over {axis!r}: every device "
                        f"reads the same local positions of its own shard (global ids, e.g. "
                        f"token ids or labels, into a vocabulary-parallel table)", axis, None,
                        fix=f"subtract the shard's start (st.axis_index({axis!r}) times the "
                            f"local extent), mask the indices outside [0, local extent) and "
                            f"psum the picked values over {axis!r}; or all_gather the array "
                            f"over {axis!r} first")
            if not isinstance(err, Plain):   # (allowed: the axis stays as the rule left it)
                raise err


def aligned_shard(args: Sequence[Arg], axis: str, out_ndim: int | None, op: str) -> Kind | str:
    """The join of the operands on one axis after right-aligned broadcasting.

    Shard(d) when every sharded operand is sharded on the same dim d and every other operand
    either is equal on every device (FIXED/REP) or has extent 1 there (a per-device value
    broadcast along the shard: `logits - local_max`); REP when all are REP/FIXED; else PLAIN.
    A replicated operand that carries data (not a constant) with extent > 1 along the shard
    dim lays the same values along different slices: SPMD215.
    """
    ks = [kind(x.type, x.ref, axis) for x in args]
    shards = set(ks) - {FIXED}
    if not shards:
        return FIXED
    if shards <= {REP}:
        return REP
    dims = {k.dim for k in shards if isinstance(k, Shard)}
    if len(dims) != 1:
        return PLAIN
    (d,) = dims
    if out_ndim is not None and -d > out_ndim:
        return PLAIN
    for x, k in zip(args, ks, strict=True):
        if isinstance(k, Shard):
            continue
        ext = _extent(x, d)
        if k in (FIXED, REP):
            _check_not_laid_along(x, d, axis, op)
            continue
        if ext != 1:
            return PLAIN
    return Shard(d)


#: which ops make a zero (`Refinement.zero`: `0.0 * b`, a term that keeps `b` in the program
#: and adds nothing to a sum): the op's rule (an `ELEMENTWISE` name, or `broadcast_to`) ->
#: the operands whose being zero makes the result zero, "any" (a product) or "first" (the
#: first operand's negation, quotient, cast, copy or broadcast). The runtime and the mypy
#: plugin read it by rule (a literal `0` / `0.0` operand is zero), the jaxpr walk by its
#: primitive's rule (`PRIMITIVES`), so the three agree on `-(0.0 * b)` and `(0.0 * b) / 2`.
ZERO_FLOWS: dict[str, str] = {"mul": "any", "div": "first", "neg": "first", "copy": "first",
                              "astype": "first", "broadcast_to": "first"}

#: the refinement of a literal zero operand (`0`, `0.0`)
ZERO = Refinement(zero=True)


def zero_result(rule: str | None, zeros: Sequence[bool]) -> bool:
    """Whether the result of the op of rule `rule` is zero, given which of its operands are
    zero (`ZERO_FLOWS`)."""
    how = ZERO_FLOWS.get(rule) if rule is not None else None
    if how == "any":
        return any(zeros)
    return how == "first" and bool(zeros) and zeros[0]


def elementwise(name: str, args: Sequence[Arg], out: SpmdType, *, op: str,
                out_ndim: int | None = None, onehot_fill: bool = False) -> Refinement:
    """The refinement of an elementwise op's result (`out` is the four-state result); zero
    where `ZERO_FLOWS` says so.

    `onehot_fill`: for `where`, the unselected branch is a literal 0 (the owner mask).
    """
    result = per_axis(out.varying, lambda a: _elementwise_axis(
        name, args, [kind(x.type, x.ref, a) for x in args], a, out, op, out_ndim, onehot_fill))
    ref = Refinement.of(result, data=any(x.ref.data for x in args))
    if zero_result(name, [x.ref.zero for x in args]):
        ref = dataclasses.replace(ref, zero=True)
    return ref


def _shares_as_partial(args: Sequence[Arg], ks: list[Kind | str], has_p: list[int],
                       a: str) -> list[Kind | str]:
    """A replicated operand divided by the size of axes `S` (`Refinement.share`) is a Partial
    term on `a` when `a` is in `S` and a partial operand is Partial on every axis of `S`: the
    reduction over `S` counts it exactly once (`h @ w2 + b / n`, the pre-divided bias). A zero
    (`Refinement.zero`: `0.0 * b`) is a Partial term on every axis."""
    out = list(ks)
    for i, (x, k) in enumerate(zip(args, ks, strict=True)):
        share = x.ref.share
        if k in (FIXED, REP) and x.ref.zero:  # a zero term sums to zero: a partial sum of it
            out[i] = PARTIAL
            continue
        if k not in (FIXED, REP) or a not in share:
            continue
        if any(all(kind(args[j].type, args[j].ref, b) is PARTIAL for b in share) for j in has_p):
            out[i] = PARTIAL
    return out


def _elementwise_axis(name: str, args: Sequence[Arg], ks: list[Kind | str], a: str,
                      out: SpmdType, op: str, out_ndim: int | None,
                      onehot_fill: bool) -> Kind | None:
    n = len(args)
    has_p = [i for i, k in enumerate(ks) if k is PARTIAL]
    if has_p and name in ADDITIVE:
        ks = _shares_as_partial(args, ks, has_p, a)
        has_p = [i for i, k in enumerate(ks) if k is PARTIAL]
    if name in SELECTING and n == 3:
        pred, on_true, on_false = ks
        if has_p and pred not in (FIXED, REP):
            raise fail("SPMD213", op, f"the predicate varies over {a!r} and a branch is a partial "
                        f"sum there: selecting per device mixes terms of different sums", a, None,
                        fix=f"reduce the branch first (st.psum(x, {a!r})), or make the predicate "
                            f"uniform over {a!r}")
        if pred is ONEHOT and onehot_fill and on_true in (FIXED, REP):
            return PARTIAL  # where(axis_index(a) == c, x, 0): the owner's term of x
        if has_p:
            if on_true is PARTIAL and (on_false is PARTIAL or onehot_fill):
                return PARTIAL  # masking a partial sum with a uniform predicate: linear
            return None
        joined = aligned_shard(args, a, out_ndim, op)
        return None if joined in (PLAIN, FIXED) else joined  # type: ignore[return-value]
    if has_p:
        others = [k for i, k in enumerate(ks) if i not in has_p]
        if n == 1:
            if name in LINEAR_UNARY:
                return PARTIAL
            raise nonlinear(name, a, op, why=" (its true value is the psum)")
        if name in ADDITIVE:
            if all(k is PARTIAL for k in ks):
                return PARTIAL
            if any(k in (FIXED, REP) for k in others):
                j = next(i for i, k in enumerate(ks) if k in (FIXED, REP))
                what = "a literal" if args[j].type is LITERAL else (
                    "a replicated value" if ks[j] is REP else "an Invariant value")
                raise fail("SPMD210", op, f"a partial sum over {a!r} is combined with {what}: the "
                            f"replicated term would be counted once per device when the partial "
                            f"sums are reduced (e.g. a bias added before the reduction)", a, None,
                            fix=f"st.psum(x, {a!r}) {'+' if name == 'add' else '-'} b   "
                                f"(reduce first, then add the replicated term), or add "
                                f"b / st.axis_size({a!r}) before the reduction")
            if any(isinstance(k, Shard) for k in others):
                raise fail("SPMD210", op, f"a partial sum over {a!r} is combined with a shard of a "
                            f"global array over {a!r}: the shard would be counted once per device "
                            f"when the partial sums are reduced (e.g. x - mean(x) over a sharded "
                            f"hidden dim)", a, None,
                            fix=f"reduce the partial sum first: x - st.psum(m, {a!r})")
            return None  # Partial +- plain: nothing can be followed
        if name in SCALING:
            if len(has_p) > 1:
                raise fail("SPMD211", op, f"both operands are partial sums over {a!r}: the product "
                            f"of partial sums is not the partial sum of the product", a, None,
                            fix=partial_fix(a))
            return PARTIAL if all(k in (FIXED, REP) for k in others) else None
        if name in DIVIDING:
            if n == 2 and ks[1] is PARTIAL:
                raise fail("SPMD212", op, f"the divisor is a partial sum over {a!r}: each device "
                            f"divides by its local term instead of the total (e.g. a normaliser "
                            f"or token count computed over a shard)", a, None,
                            fix=f"x / st.psum(d, {a!r})  (reduce the divisor first)")
            return PARTIAL if all(k in (FIXED, REP) for k in others) else None
        raise nonlinear(name, a, op, what="an operand", why=" (its true value is the psum)")
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
    joined = aligned_shard(args, a, out_ndim, op)
    return None if joined in (PLAIN, FIXED) else joined  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# Reductions over local dims


#: the reductions (`_surface` kind "reduction") that are sums: a Shard dim summed gives a
#: Partial (a mean too: a sum divided by the local count); every other one gives plain
SUMS = frozenset({"sum", "mean"})


def drop_dims(k: Kind, removed: frozenset[int]) -> Kind | None:
    """A Shard's dim after `removed` (negative dims) are dropped (keepdims=False)."""
    if not isinstance(k, Shard):
        return k
    if k.dim in removed:
        return None
    # dims to the right of the shard that are removed shift it right
    return Shard(k.dim + sum(1 for r in removed if r > k.dim))


def reduction(name: str, t: SpmdType, ref: Refinement, out: SpmdType, *, ndim: int | None,
              axis: int | Sequence[int] | None, keepdims: bool = False, op: str) -> Refinement:
    """`x.sum(axis)` and friends: summing a Shard dim makes a Partial, and so does a mean (a
    sum divided by the local count, a literal: `psum(mean) / n` is Megatron's correct
    spelling); other reductions of a Shard dim give plain; a Partial stays Partial under
    `sum`/`mean` (a mean over local dims divides by a replicated count), and is an error under
    non-linear reductions (the max of partial sums is not the partial sum of maxes)."""
    removed = dims_of(axis, ndim) if ndim is not None else None

    def one(a: str) -> Kind | None:
        k = kind(t, ref, a)
        if k is PARTIAL:
            if name in SUMS:
                return PARTIAL
            raise nonlinear(name, a, op)
        if isinstance(k, Shard):
            if removed is None:
                return None
            if k.dim in removed:
                return PARTIAL if name in SUMS else None
            return k if keepdims else drop_dims(k, removed)
        return REP if k is REP else None

    return Refinement.of(per_axis(out.varying, one), data=ref.data)


def along_dim(name: str, t: SpmdType, ref: Refinement, out: SpmdType, *, ndim: int | None,
              axis: int | None, op: str) -> Refinement:
    """`cumsum`/`sort`/`flip`/`roll`/`take`/`argsort` along one dim (or flattened): a Shard on
    that dim gives plain (the op would need the other devices' slices); elsewhere kept. A
    Partial is kept by the linear ones (cumsum, flip, roll, take) and rejected by sort."""
    dims = dims_of(axis, ndim) if ndim is not None else None

    def one(a: str) -> Kind | None:
        k = kind(t, ref, a)
        if k is PARTIAL:
            if name in LINEAR_UNARY or name == "take":
                return PARTIAL
            raise nonlinear(name, a, op)
        if isinstance(k, Shard):
            return k if dims is not None and axis is not None and k.dim not in dims else None
        return REP if k is REP else None

    return Refinement.of(per_axis(out.varying, one), data=ref.data)


# ---------------------------------------------------------------------------------------------
# Contractions


def einsum_parse(spec: str, n: int) -> tuple[list[str], str] | None:
    """`spec`'s operands' subscripts and its result's (implicit output: the letters used
    once, sorted); None for an ellipsis or another number of operands than `n`."""
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
    parsed = einsum_parse(spec, len(args))

    def one(a: str) -> Kind | None:
        ks = [kind(x.type, x.ref, a) for x in args]
        ps = [i for i, k in enumerate(ks) if k is PARTIAL]
        if len(ps) > 1:
            raise fail("SPMD211", op, f"two operands are partial sums over {a!r}: the product of "
                        f"partial sums is not the partial sum of the product", a, None,
                        fix=partial_fix(a))
        if ps:
            return PARTIAL if all(k in (FIXED, REP) for i, k in enumerate(ks) if i not in ps) else None
        if all(k in (FIXED, REP) for k in ks):
            return REP
        if parsed is None or any(k not in (FIXED, REP) and not isinstance(k, Shard) for k in ks):
            return None
        ins, outs = parsed
        letters: set[str] = set()
        for sub, k in zip(ins, ks, strict=True):
            if isinstance(k, Shard):
                if -k.dim > len(sub):
                    return None
                letters.add(sub[k.dim])
        if len(letters) != 1:
            return None
        (c,) = letters
        # every operand that has letter c must be sharded on it (else shards meet a full dim);
        # a replicated operand that has it, where c is a batch letter (kept in the output),
        # lays the same values along every device's slice (k / v heads replicated against
        # q heads sharded: GQA under head parallelism)
        for sub, k, x in zip(ins, ks, args, strict=True):
            if c in sub and c in outs and k in (FIXED, REP):
                _check_not_laid_along(x, sub.index(c) - len(sub), a, op)
        if any(c in sub and not (isinstance(k, Shard) and sub[k.dim] == c)
               for sub, k in zip(ins, ks, strict=True)):
            return None
        return Shard(outs.index(c) - len(outs)) if c in outs else PARTIAL

    return Refinement.of(per_axis(out.varying, one), data=any(x.ref.data for x in args))


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


def dot_spec(lhs_ndim: int, rhs_ndim: int) -> str:
    """The einsum spelling of `jnp.dot(lhs, rhs)`: the last dim of `lhs` against the
    second-to-last of `rhs` (the last for a vector); no broadcasting of batch dims."""
    if lhs_ndim == 0 or rhs_ndim == 0:
        return ""  # a product with a scalar: elementwise, not a contraction
    if lhs_ndim <= 2 and rhs_ndim <= 2:
        return matmul_spec(lhs_ndim, rhs_ndim)
    left = "abcdefgh"[: lhs_ndim - 1]
    right = "ijklmnop"[: rhs_ndim - 2] if rhs_ndim >= 2 else ""
    last = "y" if rhs_ndim >= 2 else ""
    return f"{left}z,{right}z{last}->{left}{right}{last}"


# ---------------------------------------------------------------------------------------------
# Composites

def softmax(name: str, t: SpmdType, ref: Refinement, out: SpmdType, *, ndim: int | None,
            axis: int | Sequence[int] | None, keepdims: bool = False, op: str) -> Refinement:
    """The softmax-like composites (`_surface` kind "softmax": a max, an exp, a sum and a
    divide, or a log): `softmax` / `log_softmax` / `logsumexp` over local dims `axis`. Over a
    Shard dim each device normalises by its own slice (the sum of the exponentials is a partial sum over the
    axis): SPMD211, as the decomposed program would give SPMD212 at its division. A Partial
    input is non-linear (SPMD211). Elsewhere: the shape-preserving ones keep every kind, and
    `logsumexp` drops the reduced dims like a non-linear reduction."""
    dims = dims_of(axis, ndim) if ndim is not None else None

    def one(a: str) -> Kind | None:
        k = kind(t, ref, a)
        if k is PARTIAL:
            raise nonlinear(name, a, op)
        if isinstance(k, Shard):
            if dims is None:
                return None
            if k.dim in dims:
                raise fail("SPMD211", op, f"{name} over dim {k.dim}, which is sharded over {a!r}: "
                            f"each device normalises by the sum over its own slice only (the sum "
                            f"of the exponentials is a partial sum over {a!r})", a, None,
                            fix=f"m = st.pmax(x.max({k.dim}, keepdims=True), {a!r}); "
                                f"e = st.numpy.exp(x - m); e / st.psum(e.sum({k.dim}, "
                                f"keepdims=True), {a!r})")
            if name == "logsumexp" and not keepdims:
                return drop_dims(k, dims)
            return k
        return REP if k is REP else None

    return Refinement.of(per_axis(out.varying, one), data=ref.data)
