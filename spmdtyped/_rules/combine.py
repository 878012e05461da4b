"""`combine`: JAX's auto-cast rule, then an elementwise op's Unreduced/Reduced rule, applied
to operand states (reference §3). `unary` and `binary` are its one- and two-operand forms."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence

from .._errors import SpmdTypeError, allowed, error
from .elementwise import (
    ELEMENTWISE,
    JAX_DROPS,
    JAX_KEEPS,
    KEEP,
    LITERAL,
    REJECT,
    VARY,
    Combined,
    ElementwiseRule,
    Linearity,
    Operand,
)
from .features import CONSERVATIVE, Features, active_allowances
from .states import SpmdType, fmt_axes

ADDITIVE, MULTIPLICATIVE, DIVIDE = Linearity.ADDITIVE, Linearity.MULTIPLICATIVE, Linearity.DIVIDE
DOT, SELECT = Linearity.DOT, Linearity.SELECT

def _names(i: int, n: int) -> str:
    if n == 2:
        return ("lhs", "rhs")[i]
    return f"operand {i}"


def combine(name: str, operands: Sequence[Operand], features: Features = CONSERVATIVE,
            *, op: str | None = None) -> Combined:
    """The result type of elementwise/matmul op `name` on `operands` (JAX's auto-cast rule,
    then the op's Unreduced/Reduced rule). A unary op is a 1-operand call.

    Memoised (the result depends only on the arguments and the active `st.allow` codes), so
    tracing a large model re-derives nothing."""
    return _combine(name, tuple(operands), features, op, active_allowances())


def binary(name: str, a: Operand, b: Operand, features: Features = CONSERVATIVE, *,
           op: str | None = None, int_literal: bool = False,
           zero_literal: bool = False) -> Combined:
    """The rule of the Python operator `a <name> b` on typed values, as the runtime binds it.

    `x ** k` with an int literal `k` is JAX's `integer_pow` (a unary op: strict on Unreduced);
    `u / c` with `u` Unreduced and `c` a Python scalar is bound as `u * (1/c)` on JAX versions
    without an Unreduced division rule (exact, looser than JAX), except by a literal zero
    (`zero_literal`: SPMD202, the partial quotients ±inf do not sum to the quotient).
    Everything else is `combine`.
    """
    if name == "div" and b is LITERAL and zero_literal and isinstance(a, SpmdType) and a.unreduced:
        # per device x_k / 0 is ±inf; their sum is nan where the true quotient is ±inf
        op = op or name
        raise error("SPMD202", f"{op}: division of a value Unreduced on {sorted(a.unreduced)} by "
                    f"zero is not linear (the partial quotients ±inf do not sum to the quotient)",
                    axes=sorted(a.unreduced), states=a.states(sorted(a.unreduced)), op=op,
                    fix=f"st.psum(x, {tuple(sorted(a.unreduced))!r}) / 0.0")
    if name == "pow" and b is LITERAL and int_literal and isinstance(a, SpmdType):
        return Combined(unary("integer_pow", a, features, op=op), bind="integer_pow")
    if (name == "div" and b is LITERAL and isinstance(a, SpmdType) and a.unreduced
            and not features.unreduced_div):
        return dataclasses.replace(combine("mul", [a, b], features, op=op), bind="mul_reciprocal")
    return combine(name, [a, b], features, op=op)


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
        if a.unreduced and not a.reduced and rule.linearity in (MULTIPLICATIVE, DIVIDE) and not (
                rule.linearity is DIVIDE and lit_first):
            lit_r = a.unreduced
        elif a.reduced and not a.unreduced and rule.linearity is not DOT:
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
                   fix=f"st.pcast(y, {fmt_axes(sorted(types[1].reduced))}, to='varying') first")

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
                               fix=f"reduce it first: st.psum(x, {fmt_axes(sorted(bad_u))})")
                if bad_r:
                    raise fail("SPMD205", f"{_names(i, n)} is Reduced on {sorted(t.reduced)} but "
                               f"another operand is Varying on {sorted(rest)}: JAX casts Reduced "
                               f"to Varying only on exactly the Reduced axes", bad_r, t,
                               fix=f"st.pcast(x, {fmt_axes(sorted(t.reduced))}, to='varying')")
                t = t.replace(varying=t.varying | rest)
        cast.append(t)

    # 2. reduced check (default_nary_reduced_rule); dot_general has none and drops R
    out_r: frozenset[str] = frozenset()
    if rule.linearity is not DOT:
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
                               fix=f"st.pcast(y, {fmt_axes(sorted(missing))}, to='reduced')")
            if rule.on_reduced == REJECT:  # mod, floordiv: JAX mixes in a replicated constant
                raise fail("SPMD203", f"{name} cannot take a Reduced value (JAX mixes a "
                           f"replicated constant into it)", out_r,
                           next(t for t in cast if t.reduced),
                           fix=f"st.pcast(x, {fmt_axes(sorted(out_r))}, to='varying') first")

    # 3. unreduced rule of the op
    usets = [t.unreduced for t in cast]
    any_u = [i for i, u in enumerate(usets) if u]
    out_u: frozenset[str] = frozenset()
    kinds = {cast[i].kind for i in any_u}
    lin = rule.linearity
    if any_u:
        if len(kinds) > 1 or "sum" not in kinds:
            raise fail("SPMD106", f"Unreduced operands must be pending sums, got {sorted(kinds)}")
        if lin is ADDITIVE:
            if len(set(usets)) > 1:
                i = next(i for i, u in enumerate(usets) if u != usets[any_u[0]])
                axes = usets[any_u[0]] ^ usets[i]
                raise fail("SPMD201", f"{_names(i, n)} is not Unreduced on the same axes as "
                           f"{_names(any_u[0], n)} ({sorted(usets[i])} vs {sorted(usets[any_u[0]])})",
                           axes, cast[i], fix=f"reduce first: st.psum(x, {fmt_axes(sorted(axes))})")
            if not features.has(rule.unreduced_feature):
                raise fail("SPMD202", f"{features.name} has no Unreduced rule for {name}",
                           usets[any_u[0]], cast[any_u[0]])
            out_u = usets[any_u[0]]
        elif lin in (MULTIPLICATIVE, DIVIDE):
            if len(any_u) > 1 or (lin is DIVIDE and any_u != [0]):
                i = any_u[-1]
                raise fail("SPMD201", f"{_names(i, n)} is Unreduced; {name} takes at most one "
                           f"Unreduced operand{' (the numerator)' if lin is DIVIDE else ''}",
                           usets[i], cast[i])
            (i,) = any_u
            others = [t for j, t in enumerate(cast) if j != i]
            if any(t.reduced != usets[i] for t in others):
                j = next(j for j, t in enumerate(cast) if j != i and t.reduced != usets[i])
                raise fail("SPMD201", f"{_names(i, n)} is Unreduced on {sorted(usets[i])}, so "
                           f"{_names(j, n)} must be Reduced on exactly those axes",
                           usets[i], cast[j],
                           fix=f"st.pcast(y, {fmt_axes(sorted(usets[i]))}, to='reduced')")
            if not features.has(rule.unreduced_feature):
                raise fail("SPMD202", f"{features.name} has no Unreduced rule for {name}",
                           usets[i], cast[i])
            out_u, out_r = usets[i], out_r - usets[i]
        elif lin is DOT:
            i = any_u[0]
            raise fail("SPMD201", f"{_names(i, n)} is Unreduced; matmul takes no Unreduced operand",
                       usets[i], cast[i], fix=f"reduce first: st.psum(x, {fmt_axes(sorted(usets[i]))})")
        elif lin is SELECT:
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
                       fix=f"{name}(st.psum(x, {fmt_axes(sorted(usets[i]))}), ...)")
    return Combined(SpmdType(out_v, out_u, out_r, "sum" if out_u else None), lit_r)


def _unary(rule: ElementwiseRule, t: SpmdType, features: Features,
           fail: Callable[..., SpmdTypeError]) -> SpmdType:
    u, r = t.unreduced, t.reduced
    what, fn = rule.label or rule.name, rule.name.split("_")[0] if rule.label else rule.name
    if u:
        mode = rule.on_unreduced
        if rule.unreduced_rejected_by is not None and features.has(rule.unreduced_rejected_by):
            if rule.linearity is Linearity.LINEAR:
                raise fail("SPMD202", f"{features.name} cannot compute {what} of an Unreduced value",
                           u, t, fix=f"{fn}(st.psum(x, {fmt_axes(sorted(u))}))")
            mode = REJECT  # what JAX silently dropped, it now rejects
        if mode == KEEP and not features.has(rule.unreduced_feature):
            raise fail("SPMD202", f"{features.name} has no Unreduced rule for {rule.name}", u, t)
        if mode == KEEP and t.kind != "sum" and rule.name not in ("reshape", "transpose", "astype"):
            raise fail("SPMD106", f"the value is Unreduced with a pending {t.kind}", u, t)
        if mode in (REJECT, JAX_DROPS, JAX_KEEPS):
            if mode != REJECT and allowed("SPMD202"):
                u = frozenset() if mode == JAX_DROPS else u
            else:
                silently = {JAX_DROPS: " (JAX silently drops the state and computes a wrong "
                                       "value)", JAX_KEEPS: " (JAX silently keeps the state)"}
                raise fail("SPMD202", f"{what} is not linear, but the value is Unreduced on "
                           f"{sorted(u)}{silently.get(mode, '')}", u, t,
                           fix=f"{fn}(st.psum(x, {fmt_axes(sorted(u))}))")
    v = t.varying
    if r:
        if rule.on_reduced == VARY:
            v, r = v | r, frozenset()
        elif rule.reduced_rejected_by is not None and features.has(rule.reduced_rejected_by):
            raise fail("SPMD203", f"{features.name} cannot compute {what} of a Reduced value", r, t,
                       fix=f"{fn}(st.pcast(x, {fmt_axes(sorted(r))}, to='varying'))")
        elif rule.on_reduced == "drop" or not features.has(rule.reduced_feature):
            r = frozenset()
        elif rule.on_reduced == REJECT:
            raise fail("SPMD203", f"{what} cannot take a Reduced value", r, t)
    return SpmdType(v, u, r, t.unreduced_kind if u else None)


def unary(name: str, t: SpmdType, features: Features = CONSERVATIVE, *, op: str | None = None) -> SpmdType:
    """The result type of unary op `name` (a 1-operand `combine`)."""
    return combine(name, [t], features, op=op).type


