"""Shard / Partial / Rep refinements in mypy types (DESIGN.md §1b): every rule is `_refine`'s.

A refinement travels in the fourth argument `K` of `SArray[V, U, R, K]` (default `Any`): a
union of str Literals, one per refined axis (`"tp=S-1"` Shard of dim -1, `"tp=P"` Partial,
`"tp=R"` Rep, `"tp=I"` an axis_index, `"tp=O"` an owner predicate), `"#2"` for a known
rank and `"/dp,tp"` for a share (`Refinement.share`: a replicated value divided by
`st.axis_size(("dp", "tp"))`), `"@-3=tp"` for a dim whose extent is the local extent of a
dim sharded over `"tp"` (`Refinement.extents`), `"0"` for a zero (`Refinement.zero`: `0.0 *
b`), always with `Any` in the union. `Any` makes
refinements gradual for mypy's own checks (a plain value fits a `Shard` parameter, a
reassigned variable may change its refinement);
where mypy merges two refinements of one variable (an assignment narrows by a meet, a ternary
joins), an axis with two kinds reads as plain Varying and two ranks as an unknown rank: the
fallback is always plain, never a new error. Standard types only: the cache and dmypy work.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Final, NamedTuple

from mypy.nodes import Context, Expression, FloatExpr, IntExpr, NameExpr, TupleExpr, UnaryExpr
from mypy.typeops import make_simplified_union
from mypy.types import (
    AnyType,
    Instance,
    LiteralType,
    Type,
    UnionType,
    get_proper_type,
)

from .. import _surface
from .._errors import SpmdTypeError
from .._rules import LITERAL, SpmdType
from .._rules import axis_size as _axis_size
from .._rules import refine as _refine
from .._rules.refine import NONE, Kind, Refinement
from .._rules.refine import shape as _refine_shape
from .codes import report
from .convert import (
    SARRAY,
    STATIC,
    Known,
    alternatives,
    any_type,
    axes_of,
    from_spmd,
    literal_value,
    state_of_args,
    str_type,
)

_CODES: Final = {_refine.PARTIAL: "P", _refine.REP: "R", _refine.INDEX: "I", _refine.ONEHOT: "O"}
_KINDS: Final = {v: k for k, v in _CODES.items()}


def _kind_code(k: Kind | int) -> str:
    """`S-1` for Shard(-1), `S+0` for a dim counted from the left (rank not known yet)."""
    if isinstance(k, int):
        return f"S+{k}"
    return f"S{k.dim}" if isinstance(k, _refine.Shard) else _CODES[k]


class Val(NamedTuple):
    """One operand alternative: its state (or LITERAL), refinement and rank (None: unknown)."""

    op: Known
    ref: Refinement = NONE
    rank: int | None = None

    @property
    def arg(self) -> _refine.Arg:
        """The rules' operand. Its shape is known only where `ref.extents` names dims of a
        known rank (their `LocalExtent`s; every other dim unknown); a local extent is only
        recorded on a slice of a value, so such an operand carries data."""
        if not self.ref.extents or self.rank is None:
            return _refine.Arg(self.op, self.ref)
        ext = dict(self.ref.extents)
        shape = tuple(_refine.LocalExtent(ext[d - self.rank]) if d - self.rank in ext else None
                      for d in range(self.rank))
        return _refine.Arg(self.op, self.ref.with_data(True), shape)

    @property
    def state(self) -> SpmdType:
        return self.op if isinstance(self.op, SpmdType) else SpmdType()


class _Slot(NamedTuple):
    """What a refinement slot holds: the kinds per axis (a dim from the left as an int), the
    rank, the share and the extents; a part that mypy merged from two readings is left out."""

    kinds: dict[str, Kind | int]
    rank: int | None
    share: tuple[str, ...]
    extents: tuple[tuple[int, tuple[str, ...]], ...]
    zero: bool


def _read_slot(k: Type) -> _Slot:
    """One pass over the slot's literals (see the module doc for their spelling)."""
    p = get_proper_type(k)
    kinds: dict[str, set[Kind | int]] = {}
    ranks: set[int] = set()
    shares: set[str] = set()
    extents: dict[int, set[tuple[str, ...]]] = {}
    zero = False
    for item in (get_proper_type(i) for i in (p.items if isinstance(p, UnionType) else [p])):
        if not (isinstance(item, LiteralType) and isinstance(item.value, str)):
            continue
        v = item.value
        if v == "0":
            zero = True
            continue
        if v.startswith("#"):
            ranks.add(int(v[1:]))
            continue
        if v.startswith("/"):
            shares.add(v[1:])
            continue
        if v.startswith("@"):
            dim, _, axes = v[1:].partition("=")
            extents.setdefault(int(dim), set()).add(tuple(axes.split(",")))
            continue
        axis, _, code = v.rpartition("=")
        kind: Kind | int
        if code.startswith("S+"):
            kind = int(code[2:])
        elif code.startswith("S"):
            kind = _refine.Shard(int(code[1:]))
        elif code in _KINDS:
            kind = _KINDS[code]
        else:
            continue
        kinds.setdefault(axis, set()).add(kind)
    # two kinds for one axis: mypy merged two refinements of one variable -> plain
    return _Slot({a: next(iter(ks)) for a, ks in kinds.items() if len(ks) == 1},
                 next(iter(ranks)) if len(ranks) == 1 else None,
                 tuple(next(iter(shares)).split(",")) if len(shares) == 1 else (),
                 tuple((d, next(iter(a))) for d, a in sorted(extents.items()) if len(a) == 1),
                 zero)


def read_k(k: Type) -> tuple[dict[str, Kind | int], int | None]:
    """The refinement slot's kinds per axis (a dim from the left as an int) and rank."""
    slot = _read_slot(k)
    return slot.kinds, slot.rank


def read(t: Type) -> tuple[Refinement, int | None]:
    """The refinement (Varying axes only, the share and the extents) and rank of a typed
    value's type."""
    p = get_proper_type(t)
    if not (isinstance(p, Instance) and p.type.fullname == SARRAY and len(p.args) == 4) \
            or isinstance(p.args[3], AnyType):
        return NONE, None
    slot = _read_slot(p.args[3])
    ref = Refinement.of({a: k for a, k in slot.kinds.items() if not isinstance(k, int)})
    if slot.share or slot.extents or slot.zero:
        ref = dataclasses.replace(ref, share=slot.share, extents=slot.extents, zero=slot.zero)
    return ref, slot.rank


def k_type(api: Any, kinds: dict[str, Kind | int] | Refinement, rank: int | None,
           *, keep_rank: bool = False) -> Type:
    """The refinement slot for `kinds` and `rank`: `Any` when no axis is refined and no extent
    known (a rank alone is kept only with `keep_rank`: a hint that names dims; elsewhere plain
    values keep the plain type `SArray[V, U, R]`)."""
    items = kinds.as_dict() if isinstance(kinds, Refinement) else kinds
    share = kinds.share if isinstance(kinds, Refinement) else ()
    extents = kinds.extents if isinstance(kinds, Refinement) else ()
    zero = isinstance(kinds, Refinement) and kinds.zero
    if not items and not share and not extents and not zero \
            and not (keep_rank and rank is not None):
        return any_type()
    s = str_type(api)
    key = (s.type, tuple(sorted(items.items())), rank, share, extents, zero)
    lits = _K_LITERALS.get(key)
    if lits is None:
        if len(_K_LITERALS) > 1024:
            _K_LITERALS.clear()
        lits = [LiteralType(f"{a}={_kind_code(k)}", s) for a, k in key[1]]
        if rank is not None:
            lits.append(LiteralType(f"#{rank}", s))
        if share:
            lits.append(LiteralType(f"/{','.join(share)}", s))
        lits.extend(LiteralType(f"@{d}={','.join(axes)}", s) for d, axes in extents)
        if zero:
            lits.append(LiteralType("0", s))
        _K_LITERALS[key] = lits
    return UnionType.make_union([*lits, any_type()])


#: the literals of a refinement slot (built once; shared, as mypy does not mutate types)
_K_LITERALS: Final[dict[tuple[object, ...], list[Type]]] = {}


def _plain(ref: Refinement) -> bool:
    """Nothing to keep in the slot: no refined axis, share, extent or zero."""
    return not ref and not ref.share and not ref.extents and not ref.zero


def encode(api: Any, out: SpmdType, ref: Refinement, rank: int | None) -> Instance:
    """`SArray[V, U, R, K]` for a state with a refinement (restricted to its Varying axes)."""
    inst = from_spmd(api, out)
    if _plain(ref):
        return inst
    ref = ref.restrict(out.varying)
    if _plain(ref):
        return inst
    return inst.copy_modified(args=[*inst.args[:3], k_type(api, ref, rank)])


def cotangent_k(api: Any, primal: Type) -> Type:
    """The refinement slot of a gradient: `_refine_shape.cotangent` of the primal's (Rep and
    Partial swap, a Shard stays)."""
    p = get_proper_type(primal)
    if not (isinstance(p, Instance) and p.type.fullname == SARRAY and len(p.args) == 4):
        return any_type()
    kinds, rank = read_k(p.args[3])
    ref = Refinement.of({a: k for a, k in kinds.items() if not isinstance(k, int)})
    return k_type(api, _refine_shape.cotangent(ref), rank)


def _join(vals: list[Val]) -> list[Val]:
    """Alternatives of one state joined (`_refine_shape.join`): control-flow merges of a variable."""
    out: list[Val] = []
    for v in vals:
        same = next((i for i, w in enumerate(out) if w.op == v.op), None)
        if same is None:
            out.append(v)
            continue
        w = out[same]
        ref = _refine_shape.join(w.ref, v.ref, w.state.varying) if isinstance(w.op, SpmdType) else NONE
        out[same] = Val(w.op, ref, w.rank if w.rank == v.rank else None)
    return out


def ralternatives(api: Any, t: Type, expr: Expression | None) -> list[Val] | None:
    """`convert.alternatives` with each alternative's refinement and rank."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY:  # the common case: one typed value
        state = state_of_args(p.args)
        if state is not None:
            ref, rank = read(p)
            return [Val(state, ref.restrict(state.varying) if ref else ref, rank)]
    alts = alternatives(api, t, expr)
    if alts is None:
        return None
    items = [get_proper_type(i) for i in (p.items if isinstance(p, UnionType) else [p])]
    vals: list[Val] = []
    for i, o in enumerate(alts):
        if o is LITERAL:
            vals.append(_ZERO if is_zero(expr) else _LITERAL)
            continue
        ref, rank = read(items[i]) if len(items) == len(alts) else (NONE, None)
        assert isinstance(o, SpmdType)
        vals.append(Val(o, ref.restrict(o.varying) if ref else ref, rank))
    return _join(vals) if len(vals) > 1 else vals


_LITERAL: Final = Val(LITERAL, NONE, 0)
#: a literal `0` / `0.0`: a zero (`_refine.ZERO_FLOWS` reads it)
_ZERO: Final = Val(LITERAL, _refine.ZERO, 0)


def arrays(vals: list[Val]) -> list[Val]:
    """A Python scalar as an Invariant rank-0 value (a unary op's operand)."""
    return [Val(SpmdType(), NONE, 0) if v.op is LITERAL else v for v in vals]


Refine = Callable[..., tuple[Refinement, int | None]]

#: the static view's `st.axis_size(axes)` and `1 / st.axis_size(axes)` (`AxisSize[A]`,
#: `AxisShare[A]`): the runtime's classes, whose values `_axis_size.share_of` reads
AXIS_SIZE: Final = f"{STATIC}.AxisSize"
SCALES: Final = {AXIS_SIZE: _axis_size.AxisSize, f"{STATIC}.AxisShare": _axis_size.AxisShare}


def scale(p: Instance) -> object | None:
    """The runtime value standing for an `AxisSize[A]` / `AxisShare[A]` operand (its axes `A`;
    the number does not matter to `share_of`), None when `A` is not literal."""
    axes = axes_of(p.args[0]) if p.args else None
    return SCALES[p.type.fullname](1, sorted(axes)) if axes else None


def with_scale(name: str, refine: Refine, operands: Sequence[object]) -> Refine:
    """`refine`, then the runtime's `b / st.axis_size(a)` rule (`_refining.refine`): the
    result of `share_of`'s operand divided by the size of axes is `with_share`'s refinement.
    `operands`: the rule's operands in order, the scale's runtime value among them."""
    share = _axis_size.share_of(name, operands)

    def refine_scaled(out: SpmdType, *vals: Val) -> tuple[Refinement, int | None]:
        ref, rank = refine(out, *vals)
        if share is not None:
            i, axes = share
            ref = _refine.with_share(ref, vals[i].op, axes)
        return ref, rank
    refine_scaled.from_plain = True  # type: ignore[attr-defined]  # a plain operand's share
    return refine_scaled


def rapply(api: Any, context: Context, default: Type, alts: Sequence[Sequence[Val]],
           rule: Callable[..., SpmdType], refine: Refine,
           on_error: Callable[[Any, SpmdTypeError, Context], None] = report) -> Type:
    """`codes.apply` with refinements: the four-state `rule` on the operands' states, then
    `refine(out, *vals)` (a `_refine` rule) for the result's refinement and rank."""
    results: list[Type] = []
    from_plain = getattr(refine, "from_plain", False)
    combos = [tuple(a[0] for a in alts)] if all(len(a) == 1 for a in alts) else itertools.product(*alts)
    for combo in combos:
        try:
            out = rule(*[v.op for v in combo])
            # `_refine`'s rules refine a result only from refined operands (a collective can
            # also refine a plain one: `from_plain`); skip them for plain operands
            if from_plain or any(v.ref or v.ref.extents or v.ref.zero for v in combo):
                ref, rank = refine(out, *combo)
            else:
                ref, rank = NONE, None
        except SpmdTypeError as err:
            on_error(api, err, context)
            return default
        results.append(encode(api, out, ref, rank))
    if len(results) == 1:
        return results[0]
    return make_simplified_union(results) if results else default


# ------------------------------------------------------------------------ literal arguments


def int_value(expr: Expression | None, t: Type | None = None) -> int | None:
    """A literal int argument (`-1` too)."""
    if isinstance(expr, IntExpr):
        return expr.value
    if isinstance(expr, UnaryExpr) and expr.op == "-" and isinstance(expr.expr, IntExpr):
        return -expr.expr.value
    v = literal_value(t) if t is not None else None
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def axis_arg(expr: Expression | None) -> tuple[bool, int | tuple[int, ...] | None]:
    """(known, value) of an `axis=` argument: an int, a tuple of ints or None."""
    if expr is None:
        return True, None
    if isinstance(expr, NameExpr) and expr.fullname == "builtins.None":
        return True, None
    i = int_value(expr)
    if i is not None:
        return True, i
    if isinstance(expr, TupleExpr):
        items = [int_value(e) for e in expr.items]
        if all(i is not None for i in items):
            return True, tuple(i for i in items if i is not None)
    return False, None


def is_zero(expr: Expression | None) -> bool:
    return isinstance(expr, (IntExpr, FloatExpr)) and expr.value == 0


def max_rank(vals: Sequence[Val]) -> int | None:
    ranks = [v.rank for v in vals]
    return None if any(r is None for r in ranks) else max((r for r in ranks if r is not None), default=0)


def shard_depth(vals: Sequence[Val]) -> int:
    """The smallest rank that holds every Shard dim of the operands (dims are from the right)."""
    return max([-k.dim for v in vals for _, k in v.ref.items if isinstance(k, _refine.Shard)], default=0)


# ------------------------------------------------------------- the `_refine` rule of each form

#: the refinement kinds (`_surface.refine_kind` of the form's rule) whose rule reads the form's
#: literal `axis` (and `keepdims`)
AXIS_KINDS: Final = frozenset({"reduction", "along", "take", "softmax"})
#: kinds of structural ops whose dims the static checker cannot follow without shapes
#: (`transpose` itself is followed with a literal permutation)
STRUCTURAL_KINDS: Final = frozenset({"reshape", "transpose", "expand", "squeeze", "broadcast",
                                     "index", "one_hot"})


def elementwise(name: str, op: str, *, onehot_fill: bool = False) -> Refine:
    def refine(out: SpmdType, *vals: Val) -> tuple[Refinement, int | None]:
        return (_refine.elementwise(name, [v.arg for v in vals], out, op=op,
                                    out_ndim=max_rank(vals), onehot_fill=onehot_fill),
                max_rank(vals))
    return refine


def matmul(op: str) -> Refine:
    """`a @ b` as the einsum `_refine.matmul_spec` spells; an operand of unknown rank is read as
    a matrix (its Shard dims, counted from the right, are then those a matmul contracts or keeps)."""
    def refine(out: SpmdType, a: Val, b: Val) -> tuple[Refinement, int | None]:
        ra = a.rank if a.rank is not None else max(2, shard_depth([a]))
        rb = b.rank if b.rank is not None else max(2, shard_depth([b]))
        spec = _refine.matmul_spec(ra, rb)
        rank = len(spec.split("->")[1]) if a.rank is not None and b.rank is not None else None
        return _refine.einsum(spec, [a.arg, b.arg], out, op=op), rank
    return refine


def einsum(spec: str | None, op: str) -> Refine:
    def refine(out: SpmdType, *vals: Val) -> tuple[Refinement, int | None]:
        if spec is None:
            return _refine.einsum("?", [v.arg for v in vals], out, op=op), None
        parsed = spec.replace(" ", "").split("->")
        return (_refine.einsum(spec, [v.arg for v in vals], out, op=op),
                len(parsed[1]) if len(parsed) == 2 and "." not in spec else None)
    return refine


def unary(name: str, op: str, *, axis: tuple[bool, int | tuple[int, ...] | None] = (True, None),
          keepdims: bool = False, perm: Sequence[int] | None = None,
          new_rank: int | None = None) -> Refine:
    """The refinement of a one-operand form `name` (reduction, along a dim, structural,
    transpose, elementwise)."""
    known, ax = axis

    def refine(out: SpmdType, v: Val) -> tuple[Refinement, int | None]:
        t, ref, rank = v.state, v.ref, v.rank
        kind = _surface.refine_kind(name)
        if kind == "softmax":  # the runtime's rule: normalising over a Shard dim is SPMD211
            axes = (ax,) if isinstance(ax, int) else ax
            ndim = rank
            if ndim is None and known and axes is not None and all(a < 0 for a in axes):
                ndim = max([shard_depth([v]), *(-a for a in axes)])
            out_rank = rank
            if name == "logsumexp" and rank is not None and not keepdims:
                out_rank = 0 if axes is None else rank - len(axes)
            return _refine.softmax(name, t, ref, out, ndim=ndim if known else None, axis=ax,
                                   keepdims=keepdims, op=op), out_rank
        if kind == "reduction":
            if not known:
                return _refine.reduction(name, t, ref, out, ndim=None, axis=None, op=op), None
            axes = (ax,) if isinstance(ax, int) else ax
            ndim = rank
            if ndim is None and (axes is None or all(a < 0 for a in axes)):
                ndim = max([shard_depth([v]), *(-a for a in axes or ())], default=0)
            out_rank = None
            if rank is not None:
                out_rank = rank if keepdims else (0 if axes is None else rank - len(axes))
            return _refine.reduction(name, t, ref, out, ndim=ndim, axis=ax, keepdims=keepdims,
                                     op=op), out_rank
        if kind in ("along", "take"):
            a = ax if isinstance(ax, int) or ax is None else None
            ndim = rank if rank is not None else (max(shard_depth([v]), -a) if isinstance(a, int)
                                                   and a < 0 else None)
            return _refine.along_dim(name, t, ref, out, ndim=ndim, axis=a if known else None,
                                     op=op), rank
        if name == "transpose":
            if rank is not None and (perm is None or len(perm) == rank):
                return _refine_shape.transpose(t, ref, perm, rank).restrict(out.varying), rank
            return _refine_shape.dims_unknown(t, ref, out), rank
        if kind in STRUCTURAL_KINDS:
            if name == "one_hot":  # not linear: a Partial operand is an error
                _refine.elementwise(name, [v.arg], out, op=op)
            return _refine_shape.dims_unknown(t, ref, out), new_rank
        return _refine.elementwise(name, [v.arg], out, op=op, out_ndim=rank), rank
    return refine


# ----------------------------------------------------------------- calls of user functions


def has_refinement(t: Type) -> bool:
    """Whether a parameter type declares a refinement (`Shard[...]`, `Partial[...]`, ...)."""
    p = get_proper_type(t)
    return isinstance(p, Instance) and p.type.fullname == SARRAY and len(p.args) == 4 \
        and not isinstance(get_proper_type(p.args[3]), AnyType)


def check_call(ctx: Any, callee: Any) -> Type:
    """A call of a user function with refined parameters: each argument must fit its hint
    (`_refine_shape.accepts`: a plain Varying value fits, an Invariant one or another kind does
    not), reported as mypy reports any other argument mismatch (`arg-type`)."""
    from mypy import errorcodes

    for i, formal in enumerate(callee.arg_types):
        if i >= len(ctx.arg_types) or not has_refinement(formal):
            continue
        want, _ = read(formal)
        for expr, actual in zip(ctx.args[i], ctx.arg_types[i], strict=True):
            vals = ralternatives(ctx.api, actual, expr)
            for v in vals or ():
                if not isinstance(v.op, SpmdType):
                    continue
                why = _refine_shape.accepts(want, v.ref, v.op)
                if why:
                    name = callee.arg_names[i] or str(i + 1)
                    ctx.api.fail(f'Argument "{name}" to "{callee.name or "function"}" does not fit its '
                                 f"hint {_refine.describe(v.op, want)}: {why}", expr,
                                 code=errorcodes.ARG_TYPE)
                    break
    return ctx.default_return_type
