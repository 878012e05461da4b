"""The refinement walk's memo of whole equations (issue 27, item 6: the engine's cost).

What `RefineWalk.eqn` writes for an equation's results (their refinements and their side
facts, `refine_facts.Side`) is a function of the equation's static facts (`eqns.EqnView`:
primitive, params, abstract values, literal values) and of what the walk knows of its
operands (refinement, side facts, known scalar value). A program's repeated layers repeat
their equations with the same operands' facts: `key` names that input, `record` keeps the
results the walk wrote the first time, and `replayed` writes them again for the next equation
with the same key, without running the rules. `replay` does both in one pass for most
equations (`EqnView.replay`): the walk's per-equation cost on a repeated layer.

Only what those inputs decide is memoized:
- an equation that reported a violation or changed the pending ones is not recorded (the
  walk does not call `record`), nor one that made a sum of in_spec Shards
  (`refine_content.Summed`: it carries its line; `record` returns None);
- a reduction whose residual check reads the sum its operand is (`refine_content.
  residual_terms`: through reshapes and casts, the two terms of an add or a scatter-add) is
  keyed on those terms' facts as well;
- a call (`primitives.CALLS`: a jit, a `custom_jvp` function) is keyed on the shapes of its
  nested jaxprs (`eqns.Views.call_key`), not their identity: its results' side facts are
  its body's, their lineage the union of its operands' (`refine_content.track`), as for any
  equation;
- `key` is None (walk it) for control flow and the other equations that hold a nested jaxpr
  (their own memo is `RefineWalk.calls`), an operand with a pending violation or a sum of
  in_spec Shards (or such a term of its sum),
  `optimization_barrier` (each output keeps its own operand's inputs), a non-scalar literal,
  and any equation of a jaxpr whose gradients are batched (the per-example sums);
- what stays per value is written on every equation, replayed or not: the inputs a result is
  computed from (`Side.lineage`, the union of its operands'). (Its defining equation is read
  from the jaxpr when a residual check asks, `Side.defining`.)
"""

from __future__ import annotations

from typing import Any

from .. import _compat
from .._rules.refine import NONE, Refinement
from .eqns import WALKED, EqnView
from .refine_content import residual_terms
from .refine_facts import Side, is_literal

#: what `record` keeps of each result: its refinement, its side facts but lineage and sums
#: (`Side.replayable`) and its `fact_id`
Record = tuple[tuple[Refinement, tuple[tuple[str, Any], ...], int], ...]


def fact_id(v: Any, env: dict[Any, Refinement], side: Side, scalars: dict[Any, object],
            known: dict[Any, int]) -> int:
    """The number of what the walk knows of the value `v` (its refinement, `Side.signature`,
    known scalar): equal for values the walk cannot tell apart, numbered in `known` (one per
    check). Kept in `side.ids` once read: a value's facts are written where it is defined,
    before any use reads them (`Side.mark_grad`, the one later write, drops it)."""
    got = side.ids.get(v)
    if got is None:
        facts = (env.get(v, NONE), side.signature(v), scalars.get(v))
        got = side.ids[v] = known.setdefault(facts, len(known))
    return got


def key(view: EqnView, static: Any, env: dict[Any, Refinement], side: Side,
        scalars: dict[Any, object], pending: dict[Any, Any], known: dict[Any, int], *,
        quiet: bool, batched: bool) -> tuple[Any, ...] | None:
    """What the walk of the equation `view` reads (see the module docstring), each operand
    by its `fact_id`; None when it must be walked. `static`: its static facts (`EqnView.key`,
    or a call's `Views.call_key`; None: walk it). (`replay` keys most equations; this, the
    rest and every equation the walk runs the rules of.)"""
    if static is None or batched:
        return None
    name = view.name
    if name in WALKED:
        return None
    parts: list[Any] = [static, quiet]
    summed = side.summed
    if not quiet and view.summing:
        # its residual check (`refine_content.residual_terms`) reads the terms of the sum
        # its operand is: keyed on their facts too
        for v, lit in zip(view.eqn.invars, view.lits, strict=True):
            summing = None if lit else residual_terms(v, side)
            if summing is None:
                parts.append(None)
                continue
            _add, prim, terms = summing
            parts.append(prim)
            for u in terms:
                if is_literal(u):
                    value = _compat.literal_value(u)
                    if value is None:
                        return None
                    parts.append(("literal", value))
                elif (pending and u in pending) or (summed and u in summed):
                    return None
                else:
                    parts.append((u.aval, fact_id(u, env, side, scalars, known)))
    if _operands(view, parts, env, side, scalars, pending, known) is None:
        return None
    return tuple(parts)


def _operands(view: EqnView, parts: list[Any], env: dict[Any, Refinement], side: Side,
              scalars: dict[Any, object], pending: dict[Any, Any], known: dict[Any, int]
              ) -> int | None:
    """Append each operand of `view` to the key `parts`: its `fact_id` (a literal: its
    value). Returns the union of the operands' lineage (`Side.lineage`: what `_write` gives
    the results, read in the same loop), None when one cannot be keyed (a non-scalar literal,
    an operand with a pending violation or a sum of in_spec Shards)."""
    ids, summed, lineages = side.ids, side.summed, side.lineage
    invars = view.eqn.invars
    lineage = 0
    if view.literal:
        values = view.values
        for i, lit in enumerate(view.lits):
            if lit:
                value = values[i]
                if value is None:
                    return None
                parts.append(("literal", value))
                continue
            v = invars[i]
            if (pending and v in pending) or (summed and v in summed):
                return None
            got = ids.get(v)
            parts.append(fact_id(v, env, side, scalars, known) if got is None else got)
            lineage |= lineages.get(v, 0)
        return lineage
    for v in invars:
        if (pending and v in pending) or (summed and v in summed):
            return None
        got = ids.get(v)
        parts.append(fact_id(v, env, side, scalars, known) if got is None else got)
        lineage |= lineages.get(v, 0)
    return lineage


def record(view: EqnView, env: dict[Any, Refinement], side: Side, scalars: dict[Any, object],
           known: dict[Any, int]) -> Record | None:
    """The results' refinements, side facts and `fact_id`s the walk wrote for `view`; None
    when a result carries a sum of in_spec Shards (not replayed)."""
    out = []
    for o in view.eqn.outvars:
        if o in side.summed:
            return None
        out.append((env[o], side.replayable(o), fact_id(o, env, side, scalars, known)))
    return tuple(out)


def replayed(view: EqnView, key: tuple[Any, ...] | None, memo: dict[Any, Record],
             env: dict[Any, Refinement], side: Side) -> bool:
    """Write what `memo` recorded under `key` (`record`) for the results of `view`, with their
    own lineage; False when it recorded nothing (walk the equation)."""
    got = None if key is None else memo.get(key)
    if got is None:
        return False
    _write(view, got, env, side)
    return True


def replay(view: EqnView, quiet: bool, env: dict[Any, Refinement], side: Side,
           scalars: dict[Any, object], pending: dict[Any, Any], known: dict[Any, int],
           memo: dict[Any, Record]) -> bool:
    """`key` and `replayed` in one pass, for an equation of a jaxpr whose gradients are not
    batched, that `EqnView.replay` allows and whose key reads no residual terms (not an
    `EqnView.summing` sum outside autodiff): the same key, the same writes. False when the
    walk must run its rules (`key` None, or nothing recorded). (One call per equation of a
    program's repeated layers: the check's hottest path; the operands' lineage is read in the
    loop that keys them.)"""
    parts: list[Any] = [view.key, quiet]
    if view.literal or pending or side.summed:
        lineage = _operands(view, parts, env, side, scalars, pending, known)
        if lineage is None:
            return False
    else:   # `_operands` where no operand is a literal, pending or a sum: inline
        ids, lineages = side.ids, side.lineage
        lineage = 0
        for v in view.eqn.invars:
            got = ids.get(v)
            parts.append(fact_id(v, env, side, scalars, known) if got is None else got)
            lineage |= lineages.get(v, 0)
    record = memo.get(tuple(parts))
    if record is None:
        return False
    if len(record) == 1:   # `_write` of one result: inline
        o = view.eqn.outvars[0]
        ref, facts, fid = record[0]
        env[o] = ref
        if facts:
            side.restore(o, facts)
        side.ids[o] = fid
        if lineage:
            side.lineage[o] = lineage
        return True
    _write(view, record, env, side, lineage)
    return True


def _write(view: EqnView, got: Record, env: dict[Any, Refinement], side: Side,
           lineage: int | None = None) -> None:
    """Write `got` (`record`) for the results of `view`, with their own lineage (the union
    of its operands', `lineage` when the caller read it)."""
    eqn = view.eqn
    lineages = side.lineage
    if lineage is None:
        lineage = 0
        for v, lit in zip(eqn.invars, view.lits, strict=True):
            if not lit:
                lineage |= lineages.get(v, 0)
    ids = side.ids
    for o, (ref, facts, fid) in zip(eqn.outvars, got, strict=True):
        env[o] = ref
        if facts:
            side.restore(o, facts)
        ids[o] = fid
        if lineage:
            lineages[o] = lineage
