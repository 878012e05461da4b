"""THE rule table: manual-axis states and what every op does to them.

Data plus pure functions, importing neither JAX nor mypy. The runtime (`_collectives`,
`_array`, `numpy`, `_shard_map`, `adapters`), the mypy plugin and the docs generator all
read this module; nothing else in the package encodes a rule.

Sources: `shared/reference/jax_semantics.md` and its matrices (jax 0.10.2 and 0.12.0.1).
Where JAX is silently wrong (reference §6) the table is strict and names a code that
`st.allow(code)` opts out of; the JAX-compatible result is recorded next to it.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Union

from . import _errors
from ._errors import SpmdTypeError, allowed, error

# ---------------------------------------------------------------------------------------------
# States


class State(enum.StrEnum):
    """The state of a value on one manual mesh axis."""

    INVARIANT = "invariant"
    VARYING = "varying"
    UNREDUCED = "unreduced"
    REDUCED = "reduced"

    @property
    def title(self) -> str:
        return self.value.capitalize()


I, V, U, R = State.INVARIANT, State.VARYING, State.UNREDUCED, State.REDUCED  # noqa: E741

UNREDUCED_KINDS = ("sum", "max", "min")


def _axes_set(value: Iterable[str] | str | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset((value,))
    return frozenset(value)


@dataclasses.dataclass(frozen=True)
class SpmdType:
    """The manual-axis state of a value: the axes it is Varying, Unreduced and Reduced on.

    Every other axis is Invariant. Equal to JAX's `jax.typeof(raw).manual_axis_type` for the
    same value (`unreduced_kind` is `None` unless the value is Unreduced; JAX 0.12 records
    `"sum"`, `"max"` or `"min"` there, JAX 0.10 only has sums).

    **Arguments:**

    - `varying`, `unreduced`, `reduced`: iterables of axis names (a `str` counts as one axis).
    - `unreduced_kind`: `"sum"`, `"max"`, `"min"` or `None` (= `"sum"` when `unreduced` is set).

    **Raises:** `UsageError` (SPMD504) when one axis is in two states.
    """

    varying: frozenset[str] = frozenset()
    unreduced: frozenset[str] = frozenset()
    reduced: frozenset[str] = frozenset()
    unreduced_kind: str | None = None

    def __init__(
        self,
        varying: Iterable[str] | str | None = (),
        unreduced: Iterable[str] | str | None = (),
        reduced: Iterable[str] | str | None = (),
        unreduced_kind: str | None = None,
    ) -> None:
        v, u, r = _axes_set(varying), _axes_set(unreduced), _axes_set(reduced)
        for name, s in (("varying", v), ("unreduced", u), ("reduced", r)):
            bad = [a for a in s if not isinstance(a, str)]
            if bad:
                raise error("SPMD504", f"SpmdType: {name} axes must be str, got {bad[0]!r}")
        for (n1, s1), (n2, s2) in (
            (("varying", v), ("unreduced", u)),
            (("varying", v), ("reduced", r)),
            (("unreduced", u), ("reduced", r)),
        ):
            common = s1 & s2
            if common:
                raise error(
                    "SPMD504",
                    f"SpmdType: axes {sorted(common)} cannot be both {n1} and {n2}",
                    axes=sorted(common),
                )
        if unreduced_kind is not None and unreduced_kind not in UNREDUCED_KINDS:
            raise error("SPMD504", f"SpmdType: unreduced_kind must be one of {UNREDUCED_KINDS}, "
                        f"got {unreduced_kind!r}")
        if not u:
            unreduced_kind = None
        elif unreduced_kind is None:
            unreduced_kind = "sum"
        object.__setattr__(self, "varying", v)
        object.__setattr__(self, "unreduced", u)
        object.__setattr__(self, "reduced", r)
        object.__setattr__(self, "unreduced_kind", unreduced_kind)

    # -- queries
    def state(self, axis: str) -> State:
        if axis in self.varying:
            return V
        if axis in self.unreduced:
            return U
        if axis in self.reduced:
            return R
        return I

    @property
    def axes(self) -> frozenset[str]:
        """Every axis the value is not Invariant on (JAX's `mat.vur`)."""
        return self.varying | self.unreduced | self.reduced

    @property
    def kind(self) -> str:
        """The pending reduction of the Unreduced axes ("sum" unless JAX 0.12 says otherwise)."""
        return self.unreduced_kind or "sum"

    def replace(self, **kw: object) -> SpmdType:
        fields = dict(varying=self.varying, unreduced=self.unreduced, reduced=self.reduced,
                      unreduced_kind=self.unreduced_kind)
        fields.update(kw)
        return SpmdType(**fields)  # type: ignore[arg-type]

    def with_states(self, axes: Iterable[str], state: State) -> SpmdType:
        """This type with each of `axes` put in `state`."""
        a = frozenset(axes)
        v, u, r = self.varying - a, self.unreduced - a, self.reduced - a
        if state is V:
            v |= a
        elif state is U:
            u |= a
        elif state is R:
            r |= a
        return SpmdType(v, u, r, self.unreduced_kind if u else None)

    def states(self, axes: Iterable[str]) -> dict[str, str]:
        return {a: self.state(a).value for a in axes}

    # -- printing
    def __str__(self) -> str:
        parts = []
        for label, s in (("Varying", self.varying), ("Unreduced", self.unreduced),
                         ("Reduced", self.reduced)):
            if s:
                parts.append(f"{label}[{', '.join(repr(a) for a in sorted(s))}]")
        if not parts:
            return "Invariant"
        if len(parts) == 1:
            return parts[0]
        return f"Typed[{', '.join(parts)}]"

    def __repr__(self) -> str:
        extra = f", unreduced_kind={self.unreduced_kind!r}" if self.unreduced_kind not in (None, "sum") else ""
        return f"SpmdType({self}{extra})"

    def jax_str(self, order: Sequence[str] | None = None) -> str:
        """As `jax.typeof` prints it: `{V:dp, R:tp}` (empty for Invariant)."""
        def fmt(s: frozenset[str]) -> str:
            names = [a for a in order if a in s] if order else sorted(s)
            return names[0] if len(names) == 1 else f"({','.join(names)})"
        parts = [f"{k}:{fmt(s)}" for k, s in (("V", self.varying), ("U", self.unreduced),
                                               ("R", self.reduced)) if s]
        return "{" + ", ".join(parts) + "}" if parts else ""


INVARIANT = SpmdType()


def cotangent(t: SpmdType) -> SpmdType:
    """The type of a cotangent of a value of type `t`: Unreduced and Reduced swap (reference §5)."""
    return SpmdType(t.varying, t.reduced, t.unreduced, "sum" if t.reduced else None)


# ---------------------------------------------------------------------------------------------
# What the installed JAX supports


@dataclasses.dataclass(frozen=True)
class Features:
    """Rules that differ between JAX versions; `_compat` picks the installed version's set."""

    name: str
    unreduced_kind: bool          # 0.12: UnreducedKind (sum/max/min), pmax/pmin on U
    unreduced_sub_neg: bool       # 0.12: U - U and -U keep U; 0.10 raises NotImplementedError
    unreduced_div: bool           # 0.12: U / R(same axes) -> U
    reduce_max_keeps_reduced: bool  # 0.12: jnp.max(R) -> R; 0.10 drops R
    pmax_uniform: bool            # 0.12: pmax/pmin require one state over the named axes
    gather_keeps_reduced: bool = False  # 0.12: jnp.take(R) -> R; 0.10 drops R
    mod_reduced_divisor: bool = False   # 0.12: mod(V:i, R:i) -> V:i; 0.10 rejects a Reduced divisor


JAX_0_10 = Features("jax 0.10", False, False, False, False, False)
JAX_0_12 = Features("jax 0.12", True, True, True, True, True, gather_keeps_reduced=True,
                    mod_reduced_divisor=True)
#: What the mypy plugin assumes unless configured: only what every supported JAX allows.
CONSERVATIVE = JAX_0_10


# ---------------------------------------------------------------------------------------------
# Axis names


def normalize_axes(axis_name: object, op: str) -> tuple[str, ...]:
    """JAX's accepted spellings of axis names -> a tuple; sets, lists, repeats are SPMD502."""
    if isinstance(axis_name, str):
        return (axis_name,)
    if isinstance(axis_name, tuple) and all(isinstance(a, str) for a in axis_name):
        if len(set(axis_name)) != len(axis_name):
            dup = sorted({a for a in axis_name if axis_name.count(a) > 1})
            raise error("SPMD502", f"{op}: axis names repeat {dup} in {axis_name!r}", op=op,
                        fix=f"{op}(x, {tuple(dict.fromkeys(axis_name))!r})")
        return axis_name
    if isinstance(axis_name, (set, frozenset)):
        names = tuple(sorted(a for a in axis_name if isinstance(a, str)))
        raise error("SPMD502", f"{op}: axis names given as a set {axis_name!r}; the order of "
                    f"axes matters, pass a tuple", op=op, fix=f"{op}(x, {names!r})")
    if isinstance(axis_name, list):
        raise error("SPMD502", f"{op}: axis names given as a list {axis_name!r}; pass a tuple",
                    op=op, fix=f"{op}(x, {tuple(axis_name)!r})")
    raise error("SPMD502", f"{op}: axis_name must be a str or a tuple of str, got "
                f"{type(axis_name).__name__} {axis_name!r}", op=op)


def check_axes_known(
    axes: Iterable[str], op: str, manual: Iterable[str], mesh_axes: Iterable[str] | None = None
) -> None:
    """SPMD501 for a name not in the mesh (closest suggested), SPMD503 for a non-manual axis."""
    manual = tuple(manual)
    mesh = tuple(mesh_axes) if mesh_axes is not None else manual
    for a in axes:
        if a in manual:
            continue
        if a in mesh:
            raise error("SPMD503", f"{op}: axis {a!r} is not manual in this shard_map (manual "
                        f"axes: {list(manual)})", axes=(a,), op=op,
                        fix=f"st.shard_map(..., axis_names={set(manual) | {a}!r})")
        close = difflib.get_close_matches(a, mesh, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise error("SPMD501", f"{op}: {a!r} is not an axis of the mesh (axes: {list(mesh)}){hint}",
                    axes=(a,), op=op,
                    fix=f"{op}(x, {close[0]!r})" if close else None)


# ---------------------------------------------------------------------------------------------
# Collectives and casts: one row per op. `on` maps the input's (uniform) state on the named
# axes to the result state there, or to an error code. `jax_on` records what JAX does where
# spmdtyped is strict (used under `st.allow`, and by the docs' stricter-than-JAX table).

Outcome = Union[State, str]


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity (a memo key)
class AxisOp:
    name: str
    on: Mapping[State, Outcome]
    jax_on: Mapping[State, Outcome] = dataclasses.field(default_factory=dict)
    doc: str = ""
    #: other axes must not be Unreduced/Reduced (pmean divides by a replicated constant)
    plain_other_axes: bool = False
    #: JAX's public entry point (for docs and messages)
    jax_name: str = ""
    is_cast: bool = False
    #: the reduction an Unreduced input must be pending ("sum"/"max"/"min"), if U is accepted
    unreduced_kind: str | None = None


def _op(name: str, on: Mapping[State, Outcome], jax_on: Mapping[State, Outcome] | None = None,
        **kw: object) -> AxisOp:
    return AxisOp(name, dict(on), dict(jax_on or {}), **kw)  # type: ignore[arg-type]


_R_ERR, _U_ERR, _I_ERR = "SPMD101", "SPMD102", "SPMD103"

AXIS_OPS: dict[str, AxisOp] = {
    o.name: o
    for o in [
        _op("psum", {V: I, U: I, I: _I_ERR, R: _R_ERR}, {I: I}, jax_name="jax.lax.psum",
            unreduced_kind="sum", doc="sum over the axes; Unreduced input completes its pending sum"),
        _op("pmean", {V: I, U: I, I: _I_ERR, R: _R_ERR}, {I: I}, jax_name="jax.lax.pmean",
            plain_other_axes=True, unreduced_kind="sum", doc="mean over the axes"),
        _op("pmax", {V: I, U: I, I: _I_ERR, R: _R_ERR}, {I: I}, jax_name="jax.lax.pmax",
            unreduced_kind="max", doc="max over the axes"),
        _op("pmin", {V: I, U: I, I: _I_ERR, R: _R_ERR}, {I: I}, jax_name="jax.lax.pmin",
            unreduced_kind="min", doc="min over the axes"),
        _op("ppermute", {V: V, I: _I_ERR, U: _U_ERR, R: _R_ERR}, {I: V}, jax_name="jax.lax.ppermute",
            doc="send each shard to another device"),
        _op("pshuffle", {V: V, I: _I_ERR, U: _U_ERR, R: _R_ERR}, {I: V}, jax_name="jax.lax.pshuffle",
            doc="ppermute given as a permutation"),
        _op("pbroadcast", {V: V, I: _I_ERR, U: _U_ERR, R: _R_ERR}, {}, jax_name="jax.lax.pbroadcast",
            doc="broadcast one device's shard (typed Varying, as JAX does)"),
        _op("all_gather", {V: V, I: _I_ERR, U: _U_ERR, R: _R_ERR}, {I: V}, jax_name="jax.lax.all_gather",
            doc="gather the shards; every device holds the result, typed Varying"),
        _op("all_gather_invarying", {V: I, I: _I_ERR, U: _U_ERR, R: _R_ERR}, {I: I},
            jax_name="jax.lax.all_gather(to='invarying')", doc="gather the shards, typed Invariant"),
        _op("all_gather_reduced", {V: R, I: _I_ERR, U: _U_ERR, R: _R_ERR}, {},
            jax_name="jax.lax.all_gather(to='reduced')",
            doc="gather the shards, typed Reduced: the gradient comes back Unreduced (ZeRO)"),
        _op("psum_scatter", {V: V, U: V, I: _I_ERR, R: _R_ERR}, {I: V}, jax_name="jax.lax.psum_scatter",
            unreduced_kind="sum", doc="sum and scatter; Unreduced input completes its sum sharded"),
        _op("all_to_all", {V: V, I: _I_ERR, U: _U_ERR, R: _R_ERR}, {I: V}, jax_name="jax.lax.all_to_all",
            doc="split one dimension across devices and concatenate another"),
        _op("pcast_varying", {I: V, R: V, V: "SPMD301", U: "SPMD301"},
            jax_name="jax.lax.pcast(to='varying')", is_cast=True,
            doc="free cast Invariant -> Varying or Reduced -> Varying"),
        _op("pcast_reduced", {I: R, V: "SPMD301", U: "SPMD301", R: "SPMD301"},
            jax_name="jax.lax.pcast(to='reduced')", is_cast=True, doc="free cast Invariant -> Reduced"),
        _op("pcast_unreduced", {V: U, I: "SPMD301", U: "SPMD301", R: "SPMD301"},
            jax_name="jax.lax.pcast(to='unreduced')", is_cast=True, doc="free cast Varying -> Unreduced"),
        _op("pvary", {I: V, V: "SPMD301", U: "SPMD301", R: "SPMD301"},
            jax_name="jax.lax.pcast(to='varying')", is_cast=True, doc="free cast Invariant -> Varying"),
    ]
}

PCAST_TARGETS = ("varying", "reduced", "unreduced")
ALL_GATHER_TARGETS = ("varying", "invarying", "reduced")


def pcast_op(to: object, op: str = "pcast") -> str:
    if to not in PCAST_TARGETS:
        raise error("SPMD505", f"{op}: unknown to={to!r}; expected one of {PCAST_TARGETS}", op=op,
                    fix=f"{op}(x, axis, to='varying')")
    return f"pcast_{to}"


def all_gather_op(to: object) -> str:
    if to not in ALL_GATHER_TARGETS:
        raise error("SPMD505", f"all_gather: unknown to={to!r}; expected one of "
                    f"{ALL_GATHER_TARGETS}", op="all_gather")
    return {"varying": "all_gather", "invarying": "all_gather_invarying",
            "reduced": "all_gather_reduced"}[to]  # type: ignore[index]


def _fmt_axes(axes: Sequence[str]) -> str:
    return repr(axes[0]) if len(axes) == 1 else repr(tuple(axes))


def _collective_fix(code: str, op: str, axes: Sequence[str], bad: Sequence[str]) -> str:
    a, b = _fmt_axes(axes), _fmt_axes(bad)
    if code == "SPMD101":
        return (f"{op}(x, {a}) -> {op}(st.pcast(x, {b}, to='varying'), {a}); or use the value "
                f"from before the reduction; or declare a custom primitive's effects with "
                f"st.custom_op")
    if code == "SPMD102":
        return f"{op}(x, {a}) -> {op}(st.psum_scatter(x, {b}, tiled=True), {a}), or st.psum(x, {b}) first"
    if code == "SPMD103":
        return (f"drop the {op} if x is already reduced over {b}; or {op}(st.pvary(x, {b}), {a}) "
                f"to act on per-device copies")
    if code == "SPMD104":
        return f"call {op} per axis state, or st.pvary(x, ...) the Invariant axes first"
    return ""


def axis_op(
    name: str,
    t: SpmdType,
    axes: Sequence[str],
    features: Features = CONSERVATIVE,
    *,
    op: str | None = None,
) -> SpmdType:
    """The result type of collective/cast `name` over `axes` on a value of type `t`.

    Raises the SpmdTypeError of the table's code. `op` is the user-facing API name for
    messages (defaults to `name`). Memoised like `combine`.
    """
    return _axis_op(name, AXIS_OPS[name], t, tuple(axes), features, op, _active_allowances())


@functools.lru_cache(maxsize=4096)
def _axis_op(name: str, rule: AxisOp, t: SpmdType, axes: tuple[str, ...], features: Features,
             op: str | None, _allowed: frozenset[str]) -> SpmdType:
    op = op or rule.jax_name.split("(")[0].replace("jax.lax.", "st.") or name
    if not axes:
        return t
    states = {a: t.state(a) for a in axes}
    shown = str(t)

    def fail(code: str, bad: Sequence[str], headline: str) -> SpmdTypeError:
        return error(code, headline, axes=bad, states={a: states[a].value for a in bad},
                     fix=_collective_fix(code, op, axes, bad) if not rule.is_cast else None, op=op,
                     details=(f"value: {shown}",))

    distinct = set(states.values())
    if not rule.is_cast:
        for st_, code in ((R, _R_ERR), (U, _U_ERR)):
            bad = [a for a in axes if states[a] is st_]
            if bad and (st_ not in rule.on or rule.on[st_] == code):
                raise fail(code, bad, f"{op} over {_fmt_axes(axes)}: the value is {st_.title} on "
                           f"{_fmt_axes(bad)}, but {op} needs "
                           f"{' or '.join(s.title for s, o in rule.on.items() if isinstance(o, State))} there")
    if len(distinct) > 1:
        desc = ", ".join(f"{a}: {s.title}" for a, s in states.items())
        raise fail("SPMD104", list(axes), f"{op} over {_fmt_axes(axes)}: the value's state differs "
                   f"between the named axes ({desc})")
    (state,) = distinct
    outcome = rule.on.get(state, "SPMD301")
    if outcome == _I_ERR and allowed(_I_ERR) and state in rule.jax_on:
        outcome = rule.jax_on[state]
    if not isinstance(outcome, State):
        if rule.is_cast:
            to = name.removeprefix("pcast_") if name.startswith("pcast_") else "varying"
            raise fail(outcome, list(axes), f"{op} over {_fmt_axes(axes)}: cannot cast from "
                       f"{state.title} to {to.capitalize()} (value: {shown})")
        raise fail(outcome, list(axes), f"{op} over {_fmt_axes(axes)}: the value is already "
                   f"{state.title} there (JAX would pvary it first and act on identical copies)")
    if state is U and rule.unreduced_kind is not None:
        if rule.unreduced_kind != "sum" and not features.unreduced_kind:
            raise fail("SPMD106", list(axes), f"{op} over {_fmt_axes(axes)}: the value is an "
                       f"Unreduced sum, and {features.name} has no pending max/min")
        if t.kind != rule.unreduced_kind:
            raise fail("SPMD106", list(axes), f"{op} over {_fmt_axes(axes)}: the value is Unreduced "
                       f"with a pending {t.kind}, but {op} completes a {rule.unreduced_kind}")
    if rule.plain_other_axes:
        other = sorted((t.unreduced | t.reduced) - set(axes))
        if other:
            raise error("SPMD105", f"{op} over {_fmt_axes(axes)}: the value is "
                        f"{t.state(other[0]).title} on {_fmt_axes(other)}; the division by the "
                        f"axis size would need a replicated constant there", axes=other,
                        states=t.states(other), op=op, details=(f"value: {shown}",),
                        fix=f"st.psum(x, {_fmt_axes(axes)}) / st.axis_size({_fmt_axes(axes)})")
    return t.with_states(axes, outcome)  # type: ignore[arg-type]


def axis_index_type(axes: Sequence[str]) -> SpmdType:
    """`axis_index(axes)`: an int32 scalar Varying on every named axis."""
    return SpmdType(varying=axes)


def dynamic_index_type(t: SpmdType, index_types: Sequence[SpmdType],
                       features: Features = CONSERVATIVE, *, op: str = "indexing") -> SpmdType:
    """`x[i]` with traced indices (dynamic_slice): the value's unary rule (Unreduced rejected,
    Reduced kept), then JAX's auto-cast of the value to the indices' varying axes (reduced ->
    varying on exactly its reduced axes, else pvary). The indices get no reduced check:
    `x[axis_index('j')]` on `Reduced['i']` is `Typed[Varying['j'], Reduced['i']]`."""
    out = unary("dynamic_slice", t, features, op=op)
    rest = frozenset().union(*(i.varying for i in index_types)) - out.varying
    if not rest:
        return out
    if out.reduced == rest:
        return out.replace(reduced=frozenset(), varying=out.varying | rest)
    bad = out.reduced & rest
    if bad:
        raise error("SPMD205", f"{op}: the value is Reduced on {sorted(out.reduced)} but the index "
                    f"is Varying on {sorted(rest)}: JAX casts Reduced to Varying only on exactly "
                    f"the Reduced axes", axes=sorted(bad), states=out.states(sorted(bad)), op=op,
                    fix=f"st.pcast(x, {_fmt_axes(sorted(out.reduced))}, to='varying')")
    return out.replace(varying=out.varying | rest)


# ---------------------------------------------------------------------------------------------
# Elementwise ops, matmul, reductions: the combination rule (reference §3).


class Linearity(enum.StrEnum):
    ADDITIVE = "additive"        # add, sub: U only with U on the same axes
    MULTIPLICATIVE = "mul"       # mul: U x R(same axes) -> U
    DIVIDE = "div"               # div: U / R(same axes) -> U
    DOT = "dot"                  # dot_general: rejects U, drops R, no reduced check
    SELECT = "select"            # where: JAX takes U/R from the false branch only
    NONLINEAR = "nonlinear"      # rejects U; R passes if all operands agree
    LINEAR = "linear"            # unary structural/linear: U and R pass through


# what JAX does with an Unreduced operand of a unary op
KEEP, REJECT, JAX_DROPS, JAX_KEEPS = "keep", "reject", "jax-drops", "jax-keeps"


@dataclasses.dataclass(frozen=True)
class ElementwiseRule:
    name: str
    linearity: Linearity
    #: unary ops: what happens to an Unreduced input (KEEP: linear; REJECT: JAX errors;
    #: JAX_DROPS / JAX_KEEPS: JAX silently drops / keeps it -> strict SPMD202)
    on_unreduced: str = REJECT
    #: unary ops: KEEP, "drop" (JAX silently drops the marker), or REJECT
    on_reduced: str = KEEP
    #: Features flag needed for KEEP on Unreduced (else JAX raises NotImplementedError)
    unreduced_feature: str | None = None
    #: Features flag needed to keep Reduced (else JAX drops it)
    reduced_feature: str | None = None


def _ew(name: str, lin: Linearity, **kw: str | None) -> ElementwiseRule:
    return ElementwiseRule(name, lin, **kw)  # type: ignore[arg-type]


_A, _M, _D, _DOT, _SEL, _N, _L = (Linearity.ADDITIVE, Linearity.MULTIPLICATIVE, Linearity.DIVIDE,
                                  Linearity.DOT, Linearity.SELECT, Linearity.NONLINEAR,
                                  Linearity.LINEAR)

_LINEAR_UNARY = ("reshape", "transpose", "squeeze", "expand_dims", "broadcast_to", "getitem",
                 "pad", "astype", "copy", "stop_gradient", "split", "roll",
                 "tile", "repeat", "conj", "sum", "ravel", "swapaxes", "moveaxis")
_NONLINEAR_UNARY = ("exp", "log", "tanh", "sin", "cos", "sqrt", "rsqrt", "abs", "square",
                    "sign", "log1p", "expm1", "sigmoid", "silu",
                    "floor", "ceil", "round", "logical_not", "isnan", "isfinite",
                    "erf", "norm",
                    # JAX has no Unreduced rule for the real/imag primitives (complex inputs;
                    # jnp.real/imag of a real array need no primitive: st.numpy handles that)
                    "real", "imag")
_NONLINEAR_NARY = ("maximum", "minimum", "pow", "lt", "le", "gt", "ge", "eq", "ne", "and", "or",
                   "xor", "arctan2")
_JAX_DROPS = ("cumsum", "cumprod", "cummax", "cummin", "flip", "argmax", "argmin",
              "integer_pow", "prod", "at_set",
              "reciprocal")  # jnp.reciprocal is integer_pow(x, -1) (differential tests)
#: jax.nn functions that mix an Invariant constant into their input: JAX rejects a Reduced input
#: (`Inputs cannot be replicated...`, reference Q20); silu and sigmoid do not.
_NONLINEAR_NO_REDUCED = ("relu", "gelu", "softplus", "softmax", "log_softmax", "logsumexp",
                         "one_hot",
                         # jnp.var/std/mod/floor_divide do too, for every dtype (differential
                         # tests, jax 0.10.2 and 0.12.0.1)
                         "var", "std", "mod", "floordiv")
#: `.at[].add/.mul/.min/.max` (scatter-add etc.): jax 0.12 keeps U and rejects R for add; jax
#: 0.10 drops both. Strict: Unreduced rejected (SPMD202), Reduced rejected (SPMD203).
_SCATTERS = ("at_add", "at_mul", "at_min", "at_max")

ELEMENTWISE: dict[str, ElementwiseRule] = {
    r.name: r
    for r in [
        _ew("add", _A), _ew("sub", _A, unreduced_feature="unreduced_sub_neg"),
        _ew("mul", _M), _ew("div", _D, unreduced_feature="unreduced_div"),
        _ew("matmul", _DOT), _ew("dot", _DOT), _ew("einsum", _DOT), _ew("where", _SEL),
        _ew("neg", _L, on_unreduced=KEEP, unreduced_feature="unreduced_sub_neg"),
        _ew("max", _N, on_unreduced=REJECT, reduced_feature="reduce_max_keeps_reduced"),
        _ew("min", _N, on_unreduced=REJECT, reduced_feature="reduce_max_keeps_reduced"),
        _ew("mean", _L, on_unreduced=KEEP),  # sum, then a literal-cast division
        _ew("sort", _N, on_unreduced=JAX_KEEPS),
        # x[i] with a traced i: JAX raises NotImplementedError on U, keeps R (both versions)
        _ew("dynamic_slice", _N),
        *(_ew(n, _L, on_unreduced=KEEP) for n in _LINEAR_UNARY),
        *(_ew(n, _N) for n in _NONLINEAR_UNARY),
        *(_ew(n, _N) for n in _NONLINEAR_NARY),
        *(_ew(n, _N, on_unreduced=JAX_DROPS, on_reduced="drop") for n in _JAX_DROPS),
        *(_ew(n, _N, on_reduced=REJECT) for n in _NONLINEAR_NO_REDUCED),
        # n-ary structural ops: like add, Unreduced only with Unreduced on the same axes (JAX
        # also accepts U next to I, which counts the I part once per device)
        _ew("concatenate", _A, on_unreduced=KEEP), _ew("stack", _A, on_unreduced=KEEP),
        # gather: jax 0.10 drops U and R; jax 0.12 rejects U and keeps R
        _ew("take", _N, on_unreduced=JAX_DROPS, reduced_feature="gather_keeps_reduced"),
        *(_ew(n, _N, on_unreduced=JAX_DROPS, on_reduced=REJECT) for n in _SCATTERS),
    ]
}


class _LiteralOperand:
    """A Python scalar operand: Invariant, unless spmdtyped casts it to match (see `combine`)."""

    def __repr__(self) -> str:
        return "LITERAL"


LITERAL = _LiteralOperand()
Operand = Union[SpmdType, _LiteralOperand]


@dataclasses.dataclass(frozen=True)
class Combined:
    """Result of `combine`: the output type, and the axes (if any) on which spmdtyped casts
    Python-scalar operands to Reduced before binding (looser than JAX, which rejects them)."""

    type: SpmdType
    literal_reduced: frozenset[str] = frozenset()
    #: how the runtime binds it when not as the op itself: "integer_pow" (`x ** k`, k an int
    #: literal) or "mul_reciprocal" (`u / c` as `u * (1/c)` where JAX has no Unreduced div)
    bind: str | None = None


def _names(i: int, n: int) -> str:
    if n == 2:
        return ("lhs", "rhs")[i]
    return f"operand {i}"


def _feature(features: Features, flag: str | None) -> bool:
    return flag is None or bool(getattr(features, flag))


def combine(name: str, operands: Sequence[Operand], features: Features = CONSERVATIVE,
            *, op: str | None = None) -> Combined:
    """The result type of elementwise/matmul op `name` on `operands` (JAX's auto-cast rule,
    then the op's Unreduced/Reduced rule). A unary op is a 1-operand call.

    Memoised (the result depends only on the arguments and the active `st.allow` codes), so
    tracing a large model re-derives nothing."""
    return _combine(name, tuple(operands), features, op, _active_allowances())


def binary(name: str, a: Operand, b: Operand, features: Features = CONSERVATIVE, *,
           op: str | None = None, int_literal: bool = False) -> Combined:
    """The rule of the Python operator `a <name> b` on typed values, as the runtime binds it.

    `x ** k` with an int literal `k` is JAX's `integer_pow` (a unary op: strict on Unreduced);
    `u / c` with `u` Unreduced and `c` a Python scalar is bound as `u * (1/c)` on JAX versions
    without an Unreduced division rule (exact, looser than JAX). Everything else is `combine`.
    """
    if name == "pow" and b is LITERAL and int_literal and isinstance(a, SpmdType):
        return Combined(unary("integer_pow", a, features, op=op), bind="integer_pow")
    if (name == "div" and b is LITERAL and isinstance(a, SpmdType) and a.unreduced
            and not features.unreduced_div):
        return dataclasses.replace(combine("mul", [a, b], features, op=op), bind="mul_reciprocal")
    return combine(name, [a, b], features, op=op)


def _active_allowances() -> frozenset[str]:
    # the module, not a function-level import: that import cost ~2 us per op while tracing
    return _errors._ALLOWED.get()


@functools.lru_cache(maxsize=4096)
def _combine(name: str, operands: tuple[Operand, ...], features: Features, op: str | None,
             _allowed: frozenset[str]) -> Combined:
    rule = ELEMENTWISE[name]
    op = op or name
    n = len(operands)
    arrays = [o for o in operands if isinstance(o, SpmdType)]
    shown = " , ".join("literal" if o is LITERAL else str(o) for o in operands)
    details = (f"operands: ({shown})",)

    def fail(code: str, headline: str, axes: Iterable[str] = (), t: SpmdType | None = None,
             fix: str | None = None) -> SpmdTypeError:
        axes = sorted(axes)
        return error(code, f"{op}: {headline}", axes=axes,
                     states=t.states(axes) if t is not None else {}, op=op, details=details, fix=fix)

    # Python scalars: Invariant, except next to a single Unreduced/Reduced array, where they
    # are cast to Reduced on those axes (JAX rejects them; the cast is mechanical and exact).
    lit_r: frozenset[str] = frozenset()
    if len(arrays) == 1 and n > 1:
        (a,) = arrays
        lit_first = operands[0] is LITERAL
        if a.unreduced and not a.reduced and rule.linearity in (_M, _D) and not (
                rule.linearity is _D and lit_first):
            lit_r = a.unreduced
        elif a.reduced and not a.unreduced and rule.linearity is not _DOT:
            lit_r = a.reduced
    types = [o if isinstance(o, SpmdType) else SpmdType(reduced=lit_r) for o in operands]

    if n == 1:
        return Combined(_unary(rule, types[0], features, fail))

    # 0. mod/floor_divide compare their divisor with an Invariant 0 (jnp.remainder): jax 0.10
    # rejects a Reduced divisor whatever the other operand is (differential tests)
    if rule.on_reduced == REJECT and n == 2 and types[1].reduced \
            and not features.mod_reduced_divisor:
        raise fail("SPMD203", f"{name} cannot take a Reduced divisor: JAX compares it with an "
                   f"Invariant constant", types[1].reduced, types[1],
                   fix=f"st.pcast(y, {_fmt_axes(sorted(types[1].reduced))}, to='varying') first")

    # 1. auto-cast (core.auto_insert_reshard): agree on the union of varying axes
    out_v = frozenset().union(*(t.varying for t in types))
    cast: list[SpmdType] = []
    for i, t in enumerate(types):
        rest = out_v - t.varying
        if rest:
            if t.reduced == rest:
                t = t.replace(reduced=frozenset(), varying=t.varying | rest)
            else:
                bad_u, bad_r = t.unreduced & rest, t.reduced & rest
                if bad_u:
                    raise fail("SPMD201", f"{_names(i, n)} is Unreduced on {sorted(bad_u)} where "
                               f"another operand is Varying", bad_u, t,
                               fix=f"reduce it first: st.psum(x, {_fmt_axes(sorted(bad_u))})")
                if bad_r:
                    raise fail("SPMD205", f"{_names(i, n)} is Reduced on {sorted(t.reduced)} but "
                               f"another operand is Varying on {sorted(rest)}: JAX casts Reduced "
                               f"to Varying only on exactly the Reduced axes", bad_r, t,
                               fix=f"st.pcast(x, {_fmt_axes(sorted(t.reduced))}, to='varying')")
                t = t.replace(varying=t.varying | rest)
        cast.append(t)

    # 2. reduced check (default_nary_reduced_rule); dot_general has none and drops R
    out_r: frozenset[str] = frozenset()
    if rule.linearity is not _DOT:
        rsets = sorted({t.reduced for t in cast if t.reduced}, key=sorted)
        if len(rsets) > 1:
            raise fail("SPMD204", f"operands are Reduced on different axes "
                       f"({' vs '.join(str(sorted(s)) for s in rsets)})", rsets[0] | rsets[1],
                       fix="st.pcast(x, axes, to='varying') on the axes only one side is reduced on")
        if rsets:
            out_r = rsets[0]
            for i, t in enumerate(cast):
                missing = out_r - t.axes
                if missing:
                    what = "a literal" if operands[i] is LITERAL else _names(i, n)
                    raise fail("SPMD203", f"{what} is Invariant on {sorted(missing)}, where "
                               f"another operand is Reduced", missing, t,
                               fix=f"st.pcast(y, {_fmt_axes(sorted(missing))}, to='reduced')")
            if rule.on_reduced == REJECT:  # mod, floordiv: JAX mixes in a replicated constant
                raise fail("SPMD203", f"{name} cannot take a Reduced value (JAX mixes a "
                           f"replicated constant into it)", out_r,
                           next(t for t in cast if t.reduced),
                           fix=f"st.pcast(x, {_fmt_axes(sorted(out_r))}, to='varying') first")

    # 3. unreduced rule of the op
    usets = [t.unreduced for t in cast]
    any_u = [i for i, u in enumerate(usets) if u]
    out_u: frozenset[str] = frozenset()
    kinds = {cast[i].kind for i in any_u}
    lin = rule.linearity
    if any_u:
        if len(kinds) > 1 or "sum" not in kinds:
            raise fail("SPMD106", f"Unreduced operands must be pending sums, got {sorted(kinds)}")
        if lin is _A:
            if len(set(usets)) > 1:
                i = next(i for i, u in enumerate(usets) if u != usets[any_u[0]])
                axes = usets[any_u[0]] ^ usets[i]
                raise fail("SPMD201", f"{_names(i, n)} is not Unreduced on the same axes as "
                           f"{_names(any_u[0], n)} ({sorted(usets[i])} vs {sorted(usets[any_u[0]])})",
                           axes, cast[i], fix=f"reduce first: st.psum(x, {_fmt_axes(sorted(axes))})")
            if not _feature(features, rule.unreduced_feature):
                raise fail("SPMD202", f"{features.name} has no Unreduced rule for {name}",
                           usets[any_u[0]], cast[any_u[0]])
            out_u = usets[any_u[0]]
        elif lin in (_M, _D):
            if len(any_u) > 1 or (lin is _D and any_u != [0]):
                i = any_u[-1]
                raise fail("SPMD201", f"{_names(i, n)} is Unreduced; {name} takes at most one "
                           f"Unreduced operand{' (the numerator)' if lin is _D else ''}",
                           usets[i], cast[i])
            (i,) = any_u
            others = [t for j, t in enumerate(cast) if j != i]
            if any(t.reduced != usets[i] for t in others):
                j = next(j for j, t in enumerate(cast) if j != i and t.reduced != usets[i])
                raise fail("SPMD201", f"{_names(i, n)} is Unreduced on {sorted(usets[i])}, so "
                           f"{_names(j, n)} must be Reduced on exactly those axes",
                           usets[i], cast[j],
                           fix=f"st.pcast(y, {_fmt_axes(sorted(usets[i]))}, to='reduced')")
            if not _feature(features, rule.unreduced_feature):
                raise fail("SPMD202", f"{features.name} has no Unreduced rule for {name}",
                           usets[i], cast[i])
            out_u, out_r = usets[i], out_r - usets[i]
        elif lin is _DOT:
            i = any_u[0]
            raise fail("SPMD201", f"{_names(i, n)} is Unreduced; matmul takes no Unreduced operand",
                       usets[i], cast[i], fix=f"reduce first: st.psum(x, {_fmt_axes(sorted(usets[i]))})")
        elif lin is _SEL:
            i = any_u[0]
            if allowed("SPMD202"):
                last = cast[-1]
                return Combined(SpmdType(out_v, last.unreduced, last.reduced, last.unreduced_kind),
                                lit_r)
            raise fail("SPMD202", f"{_names(i, n)} is Unreduced; where selects per device, "
                       f"which is not linear in the partial sums (JAX keeps only the false "
                       f"branch's state)", usets[i], cast[i])
        else:
            i = any_u[0]
            raise fail("SPMD202", f"{name} is not linear, but {_names(i, n)} is Unreduced on "
                       f"{sorted(usets[i])}", usets[i], cast[i],
                       fix=f"{name}(st.psum(x, {_fmt_axes(sorted(usets[i]))}), ...)")
    return Combined(SpmdType(out_v, out_u, out_r, "sum" if out_u else None), lit_r)


def _unary(rule: ElementwiseRule, t: SpmdType, features: Features, fail) -> SpmdType:  # type: ignore[no-untyped-def]
    u, r = t.unreduced, t.reduced
    if u:
        mode = rule.on_unreduced
        if mode == KEEP and not _feature(features, rule.unreduced_feature):
            raise fail("SPMD202", f"{features.name} has no Unreduced rule for {rule.name}", u, t)
        if mode == KEEP and t.kind != "sum" and rule.name not in ("reshape", "transpose", "astype"):
            raise fail("SPMD106", f"the value is Unreduced with a pending {t.kind}", u, t)
        if mode in (REJECT, JAX_DROPS, JAX_KEEPS):
            if mode != REJECT and allowed("SPMD202"):
                u = frozenset() if mode == JAX_DROPS else u
            else:
                silently = {JAX_DROPS: " (JAX silently drops the state and computes a wrong "
                                       "value)", JAX_KEEPS: " (JAX silently keeps the state)"}
                raise fail("SPMD202", f"{rule.name} is not linear, but the value is Unreduced on "
                           f"{sorted(u)}{silently.get(mode, '')}", u, t,
                           fix=f"{rule.name}(st.psum(x, {_fmt_axes(sorted(u))}))")
    if r:
        if rule.on_reduced == "drop" or not _feature(features, rule.reduced_feature):
            r = frozenset()
        elif rule.on_reduced == REJECT:
            raise fail("SPMD203", f"{rule.name} cannot take a Reduced value", r, t)
    return SpmdType(t.varying, u, r, t.unreduced_kind if u else None)


def unary(name: str, t: SpmdType, features: Features = CONSERVATIVE, *, op: str | None = None) -> SpmdType:
    """The result type of unary op `name` (a 1-operand `combine`)."""
    return combine(name, [t], features, op=op).type


# ---------------------------------------------------------------------------------------------
# The shard_map boundary (reference §4)


def in_spec_type(partitioned: Iterable[str], unreduced: Iterable[str] = (), reduced: Iterable[str] = (),
                 manual: Iterable[str] | None = None, unreduced_kind: str | None = None) -> SpmdType:
    """The state an argument has inside shard_map, from its in_spec's axes."""
    m = None if manual is None else frozenset(manual)

    def keep(s: Iterable[str]) -> frozenset[str]:
        return frozenset(s) if m is None else frozenset(s) & m

    return SpmdType(keep(partitioned), keep(unreduced), keep(reduced),
                    unreduced_kind if keep(unreduced) else None)


def check_out_spec(t: SpmdType, partitioned: Iterable[str], unreduced: Iterable[str],
                   reduced: Iterable[str], manual: Sequence[str], *, where: str,
                   spec: str) -> None:
    """SPMD401 unless an output of type `t` fits its out_spec on every manual axis."""
    part, un, red = frozenset(partitioned), frozenset(unreduced), frozenset(reduced)
    for a in manual:
        s = t.state(a)
        if a in part:
            ok, want = s in (V, I), "Varying or Invariant (partitioned)"
        elif a in un:
            ok, want = s is U, "Unreduced (out_specs unreduced=...)"
        elif a in red:
            ok, want = s is R, "Reduced (out_specs reduced=...)"
        else:
            ok, want = s is I, "Invariant (the spec does not mention the axis)"
        if not ok:
            if s is I or s is V:
                fix = (f"st.psum(y, {a!r}) to make it Invariant, or mention {a!r} in the spec"
                       if s is V else f"st.pvary(y, {a!r}) is not needed; use a partitioned spec")
            elif s is U:
                fix = f"st.psum(y, {a!r}), or out_specs with unreduced={{{a!r}}}"
            else:
                fix = f"out_specs with reduced={{{a!r}}}"
            raise error("SPMD401", f"{where}: output {spec} on axis {a!r} wants {want}, but the "
                        f"value is {s.title}", axes=(a,), states={a: s.value}, fix=fix,
                        op="st.shard_map", details=(f"value: {t}", f"out_spec: {spec}"))


# ---------------------------------------------------------------------------------------------
# Documentation helpers: the docs generator and the stricter/looser table read these.

STRICTER_THAN_JAX: tuple[tuple[str, str, str], ...] = (
    ("SPMD103", "collective over an axis where the input is Invariant",
     "JAX pvarys it: psum gives n·x, pmean of summed gradients is silently accepted"),
    ("SPMD104", "ppermute/all_gather/all_to_all/pmax(0.10) over axes in mixed Varying/Invariant "
     "states", "JAX pvarys the Invariant axes"),
    ("SPMD202", "cumsum/cumprod/flip/argmax/integer_pow/reciprocal/prod/take/.at[].set/"
     "sort/where on an Unreduced value", "JAX drops (or keeps) the Unreduced state: wrong numbers"),
    ("SPMD401", "a Varying output under out_specs P(unreduced=...) (jax 0.10 casts it)",
     "jax 0.10 inserts vary_unreduced_cast; jax 0.12 rejects it"),
    ("SPMD203", "where(c, r, r) with c Invariant on r's reduced axes (and where(c, r, I) / "
     "where(c, I, r))", "JAX accepts (verified on 0.10.2 and 0.12.0.1 by the differential "
     "tests): select_n has no reduced check and takes R from the false branch only, so "
     "where(c, r, I) -> I and where(c, I, r) -> R; spmdtyped applies the n-ary reduced check"),
    ("SPMD201", "concatenate/stack of an Unreduced array with a non-Unreduced one",
     "JAX types the result Unreduced, so the other part is counted once per device"),
    ("SPMD203", "concatenate/stack of a Reduced array with an Invariant one",
     "JAX types the result Reduced; spmdtyped applies the add rule"),
    ("SPMD302", "st.cond/st.while_loop/st.fori_loop whose predicate or bounds vary: outputs and "
     "carries become Varying (an Unreduced one is rejected)",
     "JAX types such results Invariant although devices may take different paths"),
)

LOOSER_THAN_JAX: tuple[tuple[str, str], ...] = (
    ("Reduced value * / + - ** < <= > >= == != (any elementwise op but @) Python scalar",
     "the scalar is cast to Reduced (`pcast(jnp.asarray(c), axes, to='reduced')`); JAX rejects "
     "`r * 2.0`, `r < 0.5`"),
    ("Unreduced value * or / Python scalar", "the scalar is cast to Reduced, then U × R → U; "
     "JAX rejects `u * 2.0`; on jax 0.10 `u / c` is bound as `u * (1/c)`"),
    ("mean over local dimensions of a Reduced or Unreduced value", "sum, then the scalar rule "
     "above; `jnp.mean(r)` fails in JAX"),
)


# ---------------------------------------------------------------------------------------------
# jaxpr primitives (read by `adapters.infer`, which walks traced jaxprs). Names are jax 0.12's;
# `_compat.primitive_name` maps other versions' spellings (0.10: `vary_unreduced_cast_p`).

#: collective/cast primitive -> AXIS_OPS row. `pmean` is `psum_invariant` + `div`; `pshuffle`
#: binds `ppermute`; psum/psum_scatter of an Unreduced value bind the `unreduced_*` prims.
AXIS_PRIMITIVES: dict[str, str] = {
    "psum_invariant": "psum", "psum": "psum", "unreduced_psum": "psum",
    "pmax": "pmax", "pmin": "pmin", "unreduced_pmax": "pmax", "unreduced_pmin": "pmin",
    "all_gather": "all_gather", "all_gather_invariant": "all_gather_invarying",
    "all_gather_reduced": "all_gather_reduced",
    "reduce_scatter": "psum_scatter", "unreduced_reduce_scatter": "psum_scatter",
    "ppermute": "ppermute", "pbroadcast": "pbroadcast", "all_to_all": "all_to_all",
    "pvary": "pvary", "preduced": "pcast_reduced", "vary_unreduced_cast": "pcast_unreduced",
    "reduced_vary_cast": "pcast_varying",
}

#: elementwise/structural primitive -> ELEMENTWISE rule
PRIMITIVES: dict[str, str] = {
    "add": "add", "add_any": "add", "sub": "sub", "mul": "mul", "div": "div", "neg": "neg",
    "dot_general": "matmul", "select_n": "where",
    # n-ary structural ops: U only with U on the same axes, like add (JAX's nary reduced rule)
    "concatenate": "concatenate", "dynamic_update_slice": "add",
    "scatter-add": "at_add", "scatter_add": "at_add", "scatter-mul": "at_mul",
    "scatter_mul": "at_mul", "scatter-min": "at_min", "scatter_min": "at_min",
    "scatter-max": "at_max", "scatter_max": "at_max",
    "max": "maximum", "min": "minimum", "pow": "pow", "atan2": "arctan2", "rem": "mod",
    "clamp": "maximum", "lt": "lt", "le": "le", "gt": "gt", "ge": "ge", "eq": "eq", "ne": "ne",
    "and": "and", "or": "or", "xor": "xor", "not": "logical_not",
    "exp": "exp", "exp2": "exp", "log": "log", "tanh": "tanh", "sin": "sin", "cos": "cos",
    "tan": "sin", "sqrt": "sqrt", "rsqrt": "rsqrt", "abs": "abs", "square": "square",
    "sign": "sign", "log1p": "log1p", "expm1": "expm1", "logistic": "sigmoid", "erf": "erf",
    "floor": "floor", "ceil": "ceil", "round": "round", "is_finite": "isfinite",
    "integer_pow": "integer_pow", "cumsum": "cumsum", "cumprod": "cumprod",
    "cummax": "cummax", "cummin": "cummin", "cumlogsumexp": "cumprod", "rev": "flip",
    "argmax": "argmax", "argmin": "argmin", "reduce_prod": "prod", "reduce_sum": "sum",
    "reduce_max": "max", "reduce_min": "min", "sort": "sort",
    "gather": "take", "scatter": "at_set", "dynamic_slice": "dynamic_slice",
    "reshape": "reshape", "transpose": "transpose", "squeeze": "squeeze",
    "expand_dims": "expand_dims", "broadcast_in_dim": "broadcast_to", "slice": "getitem",
    "pad": "pad", "convert_element_type": "astype", "reduce_precision": "astype",
    "copy": "copy", "copy_p": "copy", "split": "split", "conj": "conj", "real": "real",
    "imag": "imag",
}

#: primitives whose rule types only their first N operands (the rest are indices, padding
#: values, shapes); the others type every operand. `select_n(pred, *cases)` types
#: (pred, *cases[::-1]), so that `where`'s last operand is JAX's first case, as in
#: `jnp.where(c, x, y)`.
PRIMITIVE_OPERANDS: dict[str, int] = {
    **{p: 1 for p in ("pad", "dynamic_slice", "gather", "scatter", "scatter-add", "scatter_add",
                      "scatter-mul", "scatter_mul", "scatter-min", "scatter_min", "scatter-max",
                      "scatter_max", "sort", "split", "rev",
                      "cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp", "argmax",
                      "argmin", "integer_pow")},
    "dynamic_update_slice": 2,
}


# ---------------------------------------------------------------------------------------------
# Autodiff, control flow, custom ops and constructors (issue 4). Read by `_autodiff`,
# `_control`, `_custom`, `numpy` and the mypy plugin.

#: forward op -> the primitive(s) JAX binds in its transpose (reference §5); cotangent states
#: follow `cotangent`. For the docs and the plugin; the runtime lets JAX transpose.
TRANSPOSES: dict[str, str] = {
    "psum": "pvary", "pvary": "psum", "pcast_varying": "psum (from Invariant) / "
    "pcast_unreduced (from Reduced)", "pcast_reduced": "psum (of the Unreduced cotangent)",
    "pcast_unreduced": "pcast_varying (Reduced -> Varying)", "all_gather": "psum_scatter",
    "psum_scatter": "all_gather (all_gather_reduced on an Unreduced input)",
    "all_gather_invarying": "dynamic_slice at axis_index", "all_gather_reduced":
    "psum_scatter of the Unreduced cotangent", "ppermute": "ppermute (inverse permutation)",
    "all_to_all": "all_to_all (split and concat axes swapped)",
}


def grad_loss_type(t: SpmdType, *, op: str = "st.grad") -> SpmdType:
    """The cotangent `grad` seeds for a loss of type `t`: Invariant or Varying like the loss.

    **Raises:** `BoundaryError` SPMD405 for an Unreduced or Reduced loss (a seed of ones in the
    swapped state would not be the derivative of the loss).
    """
    bad = sorted(t.unreduced | t.reduced)
    if bad:
        a = bad[0]
        s = t.state(a)
        fix = (f"st.psum(loss, {_fmt_axes(sorted(t.unreduced))}) inside the function"
               if t.unreduced else f"st.pcast(loss, {_fmt_axes(sorted(t.reduced))}, "
               f"to='varying') inside the function, or st.vjp with an Unreduced cotangent")
        raise error("SPMD405", f"{op}: the loss is {s.title} over {a!r}; grad seeds a cotangent "
                    f"of ones, which needs an Invariant or Varying loss", axes=bad,
                    states=t.states(bad), op=op, fix=fix, details=(f"loss: {t}",))
    return cotangent(t)


def check_cotangent(out: SpmdType, ct: SpmdType, *, op: str = "st.vjp", what: str = "output") -> None:
    """SPMD404 unless `ct` is the cotangent state of a primal output of state `out`."""
    want = cotangent(out)
    if ct == want or (ct.axes == want.axes and ct.varying == want.varying
                      and ct.unreduced == want.unreduced and ct.reduced == want.reduced):
        return
    bad = sorted(a for a in (ct.axes | want.axes) if ct.state(a) is not want.state(a))
    a = bad[0]
    raise error("SPMD404", f"{op}: the cotangent of {what} is {ct.state(a).title} over {a!r}, but "
                f"the output is {out.state(a).title} there, so its cotangent must be "
                f"{want.state(a).title}", axes=bad, states=ct.states(bad), op=op,
                details=(f"output: {out}", f"cotangent given: {ct}", f"cotangent wanted: {want}"),
                fix=f"give a cotangent of state {want} (st.cotangent_type(y))")


#: per-axis join of two states by a free cast that keeps the value (symmetric). Varying ->
#: Unreduced is free too, but reinterprets per-device values as partial sums: never implicit.
_JOIN: dict[frozenset[State], State] = {
    frozenset({I, V}): V, frozenset({I, R}): R, frozenset({R, V}): V,
}


def join_carry(before: SpmdType, after: SpmdType, *, op: str = "st.fori_loop",
               what: str = "carry", labels: tuple[str, str] = ("before the body",
                                                                 "after the body")) -> SpmdType:
    """The state a loop carry (or a cond/switch output) must have so that both `before` and
    `after` reach it by a free cast that keeps the value: per axis Invariant v Varying =
    Varying, Invariant v Reduced = Reduced, Reduced v Varying = Varying.

    **Raises:** `CastError` SPMD302 when one side is Unreduced and the other is not (or the
    pending reductions differ): no cast into or out of Unreduced keeps the value.
    """
    if before == after:
        return before
    out: dict[State, set[str]] = {V: set(), U: set(), R: set(), I: set()}
    for a in sorted(before.axes | after.axes):
        s1, s2 = before.state(a), after.state(a)
        s = s1 if s1 is s2 else _JOIN.get(frozenset({s1, s2}))
        if s is U and before.kind != after.kind:
            s = None
        if s is None:
            if s1 is U and s2 is U:
                fix = "use the same reduction on both sides"
            elif U in (s1, s2):
                fix = (f"keep it Unreduced and reduce after: st.psum(result, {a!r}); an Unreduced "
                       f"accumulator starts from st.pcast(st.pvary(zeros, {a!r}), {a!r}, "
                       f"to='unreduced')")
            else:  # pragma: no cover - every other pair joins
                fix = None
            raise error("SPMD302", f"{op}: {what} is {s1.title} over {a!r} {labels[0]} but "
                        f"{s2.title} {labels[1]}; no free cast joins {s1.title} and {s2.title}",
                        axes=(a,), states={a: f"{s1.value} {labels[0]}, {s2.value} {labels[1]}"},
                        op=op, fix=fix, details=(f"{labels[0]}: {before}", f"{labels[1]}: {after}"))
        out[s].add(a)
    kind = (before.unreduced_kind or after.unreduced_kind) if out[U] else None
    return SpmdType(out[V], out[U], out[R], kind)


def free_casts(frm: SpmdType, to: SpmdType, *, reinterpret: bool = False
               ) -> list[tuple[str, tuple[str, ...]]] | None:
    """The `pcast` steps `[(to, axes), ...]` taking state `frm` to `to`, or None if none exists.

    Without `reinterpret` only casts that keep the value (I -> V, I -> R, R -> V); with it also
    V -> U and I -> U (a declaration says the per-device values are partial sums: `st.custom_op`).
    """
    i_v, r_v, i_r, to_u = [], [], [], []
    for a in sorted(frm.axes | to.axes):
        s1, s2 = frm.state(a), to.state(a)
        if s1 is s2:
            if s1 is U and frm.kind != to.kind:
                return None
            continue
        if (s1, s2) == (I, V):
            i_v.append(a)
        elif (s1, s2) == (R, V):
            r_v.append(a)
        elif (s1, s2) == (I, R):
            i_r.append(a)
        elif reinterpret and s2 is U and s1 in (I, V) and to.kind == "sum":
            if s1 is I:
                i_v.append(a)
            to_u.append(a)
        else:
            return None
    steps = [("varying", tuple(i_v)), ("varying", tuple(r_v)), ("reduced", tuple(i_r)),
             ("unreduced", tuple(to_u))]
    return [(t, axes) for t, axes in steps if axes]


def predicate_type(t: SpmdType) -> SpmdType:
    """What a loop condition / branch predicate / trip count of type `t` imposes on the carries
    and outputs: Varying wherever it varies (devices may take different paths)."""
    return SpmdType(varying=t.varying)


def parse_states(decl: object, *, op: str, what: str) -> dict[str, State]:
    """`{axis: "varying" | State, ...}` -> `{axis: State}` (SPMD507 when malformed)."""
    if not isinstance(decl, Mapping):
        raise error("SPMD507", f"{op}: {what} must be a dict {{axis: state}}, got "
                    f"{type(decl).__name__}", op=op)
    out: dict[str, State] = {}
    for axis, s in decl.items():
        if not isinstance(axis, str):
            raise error("SPMD507", f"{op}: {what} keys must be axis names, got {axis!r}", op=op)
        try:
            out[axis] = s if isinstance(s, State) else State(str(s).lower())
        except ValueError:
            close = difflib.get_close_matches(str(s).lower(), [x.value for x in State], n=1)
            raise error("SPMD507", f"{op}: {what}[{axis!r}] = {s!r} is not a state (invariant, "
                        f"varying, unreduced, reduced)", op=op,
                        fix=f"{what}={{{axis!r}: {close[0]!r}}}" if close else None) from None
    return out


def custom_op_type(in_types: Sequence[SpmdType], requires: Sequence[Mapping[str, State]],
                   produces: Mapping[str, State] | None = None, *, op: str = "custom op",
                   names: Sequence[str] | None = None) -> SpmdType:
    """The state of a custom op's results (`st.custom_op`, `st.opaque`).

    1. Each input must have the states its `requires` entry declares (SPMD107).
    2. An Unreduced input is accepted only on axes some `requires` declares Unreduced: an
       undeclared function is not known to be linear (SPMD202).
    3. The result is the union of the inputs' states: Varying wins over Reduced and
       Invariant, Reduced over Invariant; Unreduced joins Invariant and Reduced (as in U x R)
       but not Varying (SPMD201).
    4. `produces` overrides the state on the axes it names.
    """
    names = list(names) if names is not None else [f"argument {k}" for k in range(len(in_types))]
    declared_u = {a for req in requires for a, s in req.items() if s is U}
    for k, t in enumerate(in_types):
        req = requires[k] if k < len(requires) else {}
        for a, s in req.items():
            if t.state(a) is not s:
                raise error("SPMD107", f"{op}: {names[k]} is {t.state(a).title} over {a!r}, but "
                            f"the op requires {s.title}", axes=(a,), states={a: t.state(a).value},
                            op=op, details=(f"{names[k]}: {t}",),
                            fix=(f"st.pvary(x, {a!r})" if (t.state(a), s) == (I, V) else
                                 f"st.pcast(x, {a!r}, to='varying')" if (t.state(a), s) == (R, V)
                                 else f"st.psum(x, {a!r})" if t.state(a) is U else
                                 f"bring the argument to {s.value} over {a!r}, or fix requires="))
        bad_u = sorted(t.unreduced - declared_u)
        if bad_u and not allowed("SPMD202"):
            raise error("SPMD202", f"{op}: {names[k]} is Unreduced on {bad_u}, and the op is not "
                        f"declared to take partial sums", axes=bad_u, states=t.states(bad_u),
                        op=op, details=(f"{names[k]}: {t}",),
                        fix=f"reduce first (st.psum(x, {_fmt_axes(bad_u)})), or declare "
                            f"requires={{{bad_u[0]!r}: 'unreduced'}} if the op is linear")
    out: dict[State, set[str]] = {V: set(), U: set(), R: set(), I: set()}
    kind = None
    for a in sorted(frozenset().union(*(t.axes for t in in_types)) if in_types else ()):
        seen = {t.state(a) for t in in_types}
        if U in seen:
            if V in seen:
                k = next(k for k, t in enumerate(in_types) if t.state(a) is V)
                raise error("SPMD201", f"{op}: one argument is Unreduced over {a!r} and "
                            f"{names[k]} is Varying there", axes=(a,), states={a: "varying"},
                            op=op, fix=f"st.psum(x, {a!r}) first")
            s = U
            kind = kind or next(t.kind for t in in_types if t.state(a) is U)
        else:
            s = V if V in seen else R if R in seen else I
        out[s].add(a)
    result = SpmdType(out[V], out[U], out[R], kind)
    if produces:
        for a, s in produces.items():
            result = result.with_states((a,), s)
        if result.unreduced and result.unreduced_kind is None:
            result = result.replace(unreduced_kind="sum")
    return result


#: constructors whose value does not depend on their argument's data: Varying is kept (JAX
#: pvarys the constant), Unreduced and Reduced are dropped (a fresh constant is Invariant).
LIKE_CONSTRUCTORS = ("zeros_like", "ones_like", "full_like", "empty_like")
#: constructors from shapes: always Invariant
CONSTRUCTORS = ("zeros", "ones", "full", "empty", "arange", "linspace", "eye")


def constructor_type(name: str, like: SpmdType | None = None) -> SpmdType:
    """The state of `jnp.<name>(...)`: `zeros_like(x)` is Varying where x is, else Invariant."""
    if name in LIKE_CONSTRUCTORS and like is not None:
        return SpmdType(varying=like.varying)
    if name in LIKE_CONSTRUCTORS or name in CONSTRUCTORS:
        return INVARIANT
    raise KeyError(name)


# ---------------------------------------------------------------------------------------------
# The typed function modules (`st.numpy`, `st.nn`): each function's rule and how it is bound.
# Plain data: `spmdtyped.numpy` / `spmdtyped.nn` build their functions from it, the mypy plugin
# types their calls with it, the docs list it.

#: how a function applies its rule to its arguments:
#: "unary"  -- the first argument only (further arguments are shapes, axes, shifts): `unary`
#: "binary" -- the two arguments, as the operators bind them: `binary`
#: "nary"   -- every array argument (`where`): `combine`
#: "join"   -- the arrays of a sequence (`concatenate`, `stack`): `combine`
#: "einsum" -- the operands after the subscripts string: `combine`
#: "take"   -- `unary` with a static index, `combine` of array and index with a traced one
#: "like"   -- `constructor_type(name, like=first argument)` (full_like: joined with the fill)
#: "new"    -- `constructor_type(name)` (full: joined with the fill)
FUNCTION_BINDINGS: tuple[str, ...] = ("unary", "binary", "nary", "join", "einsum", "take", "like", "new")

_NUMPY_TABLE: tuple[tuple[str, str, str], ...] = (
    # (st.numpy name, rule, binding)
    *((n, n, "unary") for n in ("exp", "log", "tanh", "sqrt", "sin", "cos", "abs", "square",
                                "sign", "log1p", "expm1", "reciprocal", "floor", "ceil",
                                "round", "isnan", "isfinite", "conj", "copy")),
    ("absolute", "abs", "unary"), ("negative", "neg", "unary"),
    *((n, r, "binary") for n, r in (
        ("add", "add"), ("subtract", "sub"), ("multiply", "mul"), ("divide", "div"),
        ("true_divide", "div"), ("power", "pow"), ("maximum", "maximum"), ("minimum", "minimum"),
        ("less", "lt"), ("less_equal", "le"), ("greater", "gt"), ("greater_equal", "ge"),
        ("equal", "eq"), ("not_equal", "ne"), ("arctan2", "arctan2"), ("mod", "mod"),
        ("remainder", "mod"), ("floor_divide", "floordiv"))),
    ("logical_not", "logical_not", "unary"), ("logical_and", "and", "binary"),
    ("logical_or", "or", "binary"), ("logical_xor", "xor", "binary"),
    # real/imag of a real array need no primitive (st.numpy types them as copy / zeros_like);
    # the rule here is the complex one
    ("imag", "imag", "unary"), ("real", "real", "unary"),
    ("where", "where", "nary"),
    *((n, r, "unary") for n, r in (("sum", "sum"), ("max", "max"), ("min", "min"),
                                   ("amax", "max"), ("amin", "min"), ("prod", "prod"),
                                   ("var", "var"), ("std", "std"), ("mean", "mean"))),
    *((n, n, "unary") for n in ("cumsum", "cumprod", "argmax", "argmin", "flip", "sort")),
    *((n, n, "unary") for n in ("reshape", "transpose", "swapaxes", "moveaxis", "expand_dims",
                                "squeeze", "ravel", "broadcast_to", "roll", "tile", "repeat",
                                "pad")),
    ("concatenate", "concatenate", "join"), ("stack", "stack", "join"),
    ("einsum", "einsum", "einsum"), ("dot", "dot", "binary"), ("matmul", "matmul", "binary"),
    ("take", "take", "take"),
    *((n, n, "like") for n in LIKE_CONSTRUCTORS),
    *((n, n, "new") for n in CONSTRUCTORS),
)

#: st.numpy function -> its rule (an `ELEMENTWISE` key, or a constructor name)
NUMPY_FUNCTIONS: dict[str, str] = {n: r for n, r, _ in _NUMPY_TABLE}
#: st.numpy function -> its binding (one of `FUNCTION_BINDINGS`)
NUMPY_BINDINGS: dict[str, str] = {n: b for n, _, b in _NUMPY_TABLE}

#: st.nn function -> its rule (all non-linear, all bound on their first argument)
NN_FUNCTIONS: dict[str, str] = {n: n for n in ("relu", "gelu", "silu", "sigmoid", "softplus",
                                               "softmax", "log_softmax", "logsumexp", "one_hot")}
NN_BINDINGS: dict[str, str] = dict.fromkeys(NN_FUNCTIONS, "unary")
