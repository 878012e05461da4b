"""Collectives and casts: one `AxisOp` row per op (`AXIS_OPS`) and `axis_op`, which applies a
row to a value's state over the named axes.

To find what an op does to a state, read its row: `AXIS_OPS["psum_scatter"].on[U]` is the
state an Unreduced input gets (Varying), or the error code when the op rejects it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Union

from .._errors import SpmdTypeError, allowed, error
from .features import CONSERVATIVE, Features, active_allowances
from .states import I, R, SpmdType, State, U, V, fmt_axes

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
    #: the result of a plain (unrefined) input is refined (`refine_shape.collective`: pvary
    #: and pcast(to="varying") make Rep, psum_scatter / all_to_all make Shard)
    from_plain: bool = False


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
            from_plain=True, unreduced_kind="sum", doc="sum and scatter; Unreduced input completes its sum sharded"),
        _op("all_to_all", {V: V, I: _I_ERR, U: _U_ERR, R: _R_ERR}, {I: V}, jax_name="jax.lax.all_to_all",
            from_plain=True, doc="split one dimension across devices and concatenate another"),
        _op("pcast_varying", {I: V, R: V, V: "SPMD301", U: "SPMD301"},
            jax_name="jax.lax.pcast(to='varying')", is_cast=True, from_plain=True,
            doc="free cast Invariant -> Varying or Reduced -> Varying"),
        _op("pcast_reduced", {I: R, V: "SPMD301", U: "SPMD301", R: "SPMD301"},
            jax_name="jax.lax.pcast(to='reduced')", is_cast=True, doc="free cast Invariant -> Reduced"),
        _op("pcast_unreduced", {V: U, I: "SPMD301", U: "SPMD301", R: "SPMD301"},
            jax_name="jax.lax.pcast(to='unreduced')", is_cast=True, doc="free cast Varying -> Unreduced"),
        _op("pvary", {I: V, V: "SPMD301", U: "SPMD301", R: "SPMD301"},
            jax_name="jax.lax.pcast(to='varying')", is_cast=True, from_plain=True,
            doc="free cast Invariant -> Varying"),
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


def _collective_fix(code: str, op: str, axes: Sequence[str], bad: Sequence[str]) -> str:
    a, b = fmt_axes(axes), fmt_axes(bad)
    if code == "SPMD101":
        # the first fix keeps the numbers: x is already replicated over the axis, so the
        # collective is usually a second reduction; the pcast route changes them (n * x)
        return (f"drop the {op}: x is already reduced (replicated) over {b}, or use the value "
                f"from before the reduction; {op}(st.pcast(x, {b}, to='varying'), {a}) acts on "
                f"per-device copies and changes the numbers (a psum gives n * x); or declare a "
                f"custom primitive's effects with st.custom_op")
    if code == "SPMD102":
        return f"{op}(x, {a}) -> {op}(st.psum_scatter(x, {b}, tiled=True), {a}), or st.psum(x, {b}) first"
    if code == "SPMD103":
        if op.endswith("pmean"):
            # a gradient w.r.t. a parameter replicated over the axis is already the sum over
            # it (JAX's backward pass reduces it): dropping the pmean keeps n times the mean
            return (f"drop the {op} if x is already averaged over {b}; a gradient w.r.t. a "
                    f"parameter replicated over {b} is the SUM over {b} (JAX reduces it in the "
                    f"backward pass), so average the loss instead ({op}(loss, {b}) before "
                    f"jax.grad) or divide by the axis size; or {op}(st.pvary(x, {b}), {a}) to "
                    f"act on per-device copies")
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
    return _axis_op(name, AXIS_OPS[name], t, tuple(axes), features, op, active_allowances())


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
                raise fail(code, bad, f"{op} over {fmt_axes(axes)}: the value is {st_.title} on "
                           f"{fmt_axes(bad)}, but {op} needs "
                           f"{' or '.join(s.title for s, o in rule.on.items() if isinstance(o, State))} there")
    if len(distinct) > 1:
        desc = ", ".join(f"{a}: {s.title}" for a, s in states.items())
        raise fail("SPMD104", list(axes), f"{op} over {fmt_axes(axes)}: the value's state differs "
                   f"between the named axes ({desc})")
    (state,) = distinct
    outcome = rule.on.get(state, "SPMD301")
    if outcome == _I_ERR and allowed(_I_ERR) and state in rule.jax_on:
        outcome = rule.jax_on[state]
    if not isinstance(outcome, State):
        if rule.is_cast:
            to = name.removeprefix("pcast_") if name.startswith("pcast_") else "varying"
            raise fail(outcome, list(axes), f"{op} over {fmt_axes(axes)}: cannot cast from "
                       f"{state.title} to {to.capitalize()} (value: {shown})")
        raise fail(outcome, list(axes), f"{op} over {fmt_axes(axes)}: the value is already "
                   f"{state.title} there (JAX would pvary it first and act on identical copies)")
    if state is U and rule.unreduced_kind is not None:
        if rule.unreduced_kind != "sum" and not features.unreduced_kind:
            raise fail("SPMD106", list(axes), f"{op} over {fmt_axes(axes)}: the value is an "
                       f"Unreduced sum, and {features.name} has no pending max/min")
        if t.kind != rule.unreduced_kind:
            raise fail("SPMD106", list(axes), f"{op} over {fmt_axes(axes)}: the value is Unreduced "
                       f"with a pending {t.kind}, but {op} completes a {rule.unreduced_kind}")
    if rule.plain_other_axes:
        other = sorted((t.unreduced | t.reduced) - set(axes))
        if other:
            raise error("SPMD105", f"{op} over {fmt_axes(axes)}: the value is "
                        f"{t.state(other[0]).title} on {fmt_axes(other)}; the division by the "
                        f"axis size would need a replicated constant there", axes=other,
                        states=t.states(other), op=op, details=(f"value: {shown}",),
                        fix=f"st.psum(x, {fmt_axes(axes)}) / st.axis_size({fmt_axes(axes)})")
    return t.with_states(axes, outcome)  # type: ignore[arg-type]


def axis_index_type(axes: Sequence[str]) -> SpmdType:
    """`axis_index(axes)`: an int32 scalar Varying on every named axis."""
    return SpmdType(varying=axes)

