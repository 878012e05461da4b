"""The refinement walk's own errors (SPMD303, SPMD407, SPMD408), and the violations it holds
pending until the uses of a value decide (`Pending`, `excused`: see `refine_walk`'s module
docstring)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from .. import _compat, _rules
from .._errors import SpmdTypeError, error
from .._rules import LITERAL, SpmdType


@dataclasses.dataclass
class Pending:
    """A violation of the refinement walk that the uses of a value may excuse (see
    `refine_walk`'s module docstring)."""

    error: SpmdTypeError
    where: Any
    extra: str
    #: "nonlinear" (excused by pmax/pmin uses), "per_example" (by a sum over dim 0),
    #: "opaque" (by a cast back to Varying on the dropped axes)
    kind: str
    axes: frozenset[str] = frozenset()


def excused(p: Pending, uses: list[Any]) -> bool:
    """Whether `uses`, the equations that use the value `p` is about, excuse it: only pmax /
    pmin of a per-shard statistic, only a sum over dim 0 of a per-example gradient."""
    if not uses:
        return False
    names = [_compat.primitive_name(e) for e in uses]
    if p.kind == "nonlinear":
        return all(n in ("pmax", "pmin") for n in names)
    if p.kind == "per_example":
        return all(n == "reduce_sum" and 0 in tuple(e.params.get("axes", ()))
                   for n, e in zip(names, uses, strict=True))
    return False


def varying_predicate_error(api: str, axes: list[str], outs: Sequence[SpmdType]) -> SpmdTypeError:
    a = axes[0]
    return error("SPMD303", f"{api}: the predicate varies over {a!r}, but JAX types a result "
                 f"Invariant there: devices take different branches, and under grad the "
                 f"reduction of the operands' cotangents runs inside them (jax#40823)",
                 axes=tuple(axes), states={x: "varying predicate, invariant result" for x in axes},
                 op=api, details=tuple(f"result: {o}" for o in outs[:3]),
                 fix=f"x = jax.lax.pcast(x, {a!r}, to='varying') for each operand before the "
                     f"branch (st.cond does it), or make the predicate uniform: "
                     f"jax.lax.pmax(pred, {a!r})")


def opaque_error(name: str, axes: list[str], ins: Sequence[Any], out: SpmdType) -> SpmdTypeError:
    a = axes[0]
    return error("SPMD408", f"{name}: an input varies over {a!r} but JAX types the result "
                 f"{out.state(a).title} there: the opaque computation's per-device result is "
                 f"taken as replicated, and its backward as a finished gradient "
                 f"(jax-finufft#226)", axes=tuple(axes),
                 states={x: "dropped by an opaque computation" for x in axes}, op=name,
                 details=tuple(f"input: {t}" for t in ins if t is not LITERAL)[:3],
                 fix=f"pcast the replicated inputs to varying over {a!r} before the kernel and its "
                     f"outputs and cotangents after it (st.opaque(kernel)(...) does both)")


def _varying(ins: Sequence[Any]) -> frozenset[str]:
    """The axes any operand (not a literal) of an opaque equation varies over."""
    return frozenset().union(*(t.varying for t in ins if t is not LITERAL))


def opaque_pending(eqn: Any, name: str, ins: Sequence[Any], outs: Sequence[SpmdType],
                   where: Any, pending: dict[Any, Pending]) -> None:
    """SPMD408, pending at each result of the opaque equation `eqn` that is less varying
    than its inputs (a cast back to Varying excuses it)."""
    varying = _varying(ins)
    for v, o in zip(eqn.outvars, outs, strict=True):
        dropped = varying - o.varying
        if dropped:
            pending[v] = Pending(opaque_error(name, sorted(dropped), ins, o), where,
                                 f"primitive: {name}", "opaque", frozenset(dropped))


def opaque_call_pending(eqn: Any, ins: Sequence[Any], outs: Sequence[SpmdType], where: Any,
                        pending: dict[Any, Pending], inner: Pending) -> None:
    """An opaque result reached the outputs of a call: pending at the call when the call's
    own outputs drop the axes (the line the user wrote), else it was cast back."""
    name = _compat.primitive_name(eqn)
    varying = _varying(ins)
    for v, o in zip(eqn.outvars, outs, strict=True):
        dropped = (varying - o.varying) & inner.axes
        if dropped:
            inner_name = inner.extra.removeprefix("primitive: ")
            pending[v] = Pending(opaque_error(f"{name} of {inner_name}", sorted(dropped), ins, o),
                                 where, f"primitive: {name}", "opaque", frozenset(dropped))
            return


def per_example_error(primal: Any, loss_axes: Sequence[str]) -> SpmdTypeError | None:
    """SPMD407 for a per-example gradient of a parameter Invariant where the loss varies."""
    t = primal if isinstance(primal, SpmdType) else SpmdType()
    try:
        _rules.check_vmap_grad(SpmdType(varying=tuple(loss_axes)), [("the parameter", t)],
                               op="jax.grad")
    except SpmdTypeError as err:
        return err
    return None
