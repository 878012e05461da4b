"""The content facts of the refinement walk (`refine_walk`), issue 24 item 1: what a value's
content is across the devices of an axis where the kinds cannot say, and the checks that read
them (the rules and their messages: `_rules/refine/content.py`).

Per value and axis, kept in the walk's `Side` and carried into and out of nested calls:

- `same`: the content is equal on every device (an `all_gather` over the axis, a cast of an
  Invariant value to Varying, and every op all of whose inputs that vary there are `same`);
  `gathered`: `same` and computed from an `all_gather` (a cast alone is the opt-out:
  `psum(pvary(x))` is how a program asks for n * x);
- `sliced`: a Shard known to be the device's slice of one array (a tiled `psum_scatter`, a
  replicated value sliced at `axis_index`, ops that keep that Shard);
- `accum`: per-device terms of a sum: floating updates that vary there scatter-added into a
  zero buffer, the rows `ragged_dot` computes with this device's experts (its rhs's group dim
  sharded there), a `same` value times (`dot_general`, `mul`) an `own` one, the linear
  ops of them, and the floating functions of one such term with values the same on every
  device or this device's own (`gelu(x_all @ w[0]) @ w2[0]`: this device's expert);
- `own`: this device's member of an in_spec stack (a dim sharded over the axis squeezed away:
  `w[0]` of the expert weights, one per device);
- `unsure`: axes JAX types a value Invariant on though an input varies there (the permutation
  `argsort` returns for varying keys, jax 0.10 and 0.12): a cast of it to Varying is not `same`;
- `moved`: other devices' data was brought into the value over the axis (it is computed from
  a `ppermute`, `all_gather` or `all_to_all` over it, or from a loop or branch that holds one);
- `summed`: the sums (`psum`/`pmean`/`psum_scatter` over the axis) of in_spec Shards a value
  is computed from, reported when an output computed from one is sharded over that axis
  again by its out_spec (`at_outputs`), or at once under `strict=True`; and the diagonal
  blocks (`Block`: a `dot_general` of two operands sharded over the axis along dims that stay
  apart in the result) it is computed from, dropped where an op that combines values
  (`_rc.COMBINING`: the online softmax of a ring, the collective matmul's updates) meets an
  operand `moved` over the axis that is not computed from the block and is computed from
  every input the block's operands are (`Block.sources`), reported when an output is computed
  from one (SPMD216).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp

from .. import _compat, _surface
from .._errors import SpmdTypeError
from .._rules import LITERAL, SpmdType
from .._rules import refine as _r
from .._rules.refine import FIXED, INDEX, PARTIAL, Refinement, Shard
from .._rules.refine import content as _rc
from .eqns import EqnView
from .frames import primitive_detail, user_frame
from .primitives import IDENTITIES, STRUCTURAL
from .refine_facts import (
    CONTENT,
    Side,
    api_name,
    dot_spec,
    eqn_axes,
    exported_sums,
    is_literal,
    var_type,
)

Report = Callable[[SpmdTypeError, Any, str], None]

#: the ops a residual's sum is followed back through to its `add` (they do not change which
#: terms are summed)
_THROUGH = frozenset({"reshape", "convert_element_type", "transpose", "squeeze", "expand_dims",
                      "pvary"}) | IDENTITIES
#: the content facts a collective keeps on the axes it does not act on (`_after_collective`)
_KEPT = ("same", "gathered", "sliced", "accum", "own")
#: the ops whose output has a content fact none of their operands has (`track`)
_FROM_NOTHING = frozenset({"dynamic_slice", "gather", "scatter-add", "scatter_add",
                           "ragged_dot_general", "ragged_dot", "squeeze"})
#: the equations with nested jaxprs whose outputs are not seeded from one walk of their body
#: (`RefineWalk._call` seeds the others'): loops and branches
_CONTROL = frozenset({"cond", "while", "scan", "shard_map"})
#: the ops that keep per-device contributions contributions (linear in them)
_LINEAR = frozenset({"add", "add_any", "sub", "neg", "mul", "select_n", "concatenate",
                     "broadcast_in_dim", "scatter-add", "scatter_add", "dynamic_update_slice",
                     "pad"}) | _THROUGH


@dataclasses.dataclass(frozen=True)
class Summed:
    """A sum over `axis` of an in_spec Shard (a slice or a stack), with its SPMD108."""

    axis: str
    error: SpmdTypeError
    where: Any
    #: the inputs the summed operand is computed from (a bit set: `Side.lineage`)
    sources: int = 0


@dataclasses.dataclass(frozen=True)
class Block:
    """The diagonal block over `axis` a `dot_general` made (its two operands sharded over
    `axis` along dims that stay apart in the result), or an elementwise op of two operands
    broadcast against each other (`_rc.PAIRING`), with its SPMD216: carried with the sums in
    `Side.summed`."""

    axis: str
    error: SpmdTypeError
    where: Any
    #: the primitive that made it (its report's detail)
    primitive: str = "dot_general"
    #: the inputs its two operands are computed from (their `Side.lineage`, as
    #: `Summed.sources`, which `globalized` remaps)
    sources: int = 0
    #: the walk that made it (`Side.serial`): there `sources` and a value's lineage compare
    made_in: int = -1


def _raise(e: Exception) -> None:
    if isinstance(e, SpmdTypeError):   # an allowed code (`st.allow`) is `Plain`: nothing
        raise e


def at_collective(view: EqnView, refs: Sequence[Refinement], side: Side,
                  env: dict[Any, Refinement], where: Any, *, quiet: bool, strict: bool,
                  report: Report) -> Sequence[Refinement]:
    """Check the collective equation (`view`) against its operands' content (raises the first
    violation at it; a residual is reported at its own line); returns the operands'
    refinements as the collective's rule takes them (a psum's in_spec Shards are not checked
    there)."""
    eqn, name, ins, axes = view.eqn, view.name, view.ins, view.axes
    rule = _surface.AXIS_PRIMITIVES[name]
    op = api_name(name)
    if rule not in _rc.CHECKED:
        return refs
    for v, t, r, o in zip(eqn.invars, ins, refs, eqn.outvars, strict=False):
        if is_literal(v) or t is LITERAL:
            continue
        for a in axes:
            if a not in t.varying:
                continue
            if a in side.gathered.get(v, ()):
                _raise(_rc.gathered_operand(rule, a, op))
            k = r.get(a)
            if rule not in _rc.SUMMING or not isinstance(k, Shard):
                continue
            if a in side.sliced.get(v, ()):
                _raise(_rc.summed_slice(rule, a, k.dim, _rc.SCATTERED, op))
            elif not (r.grad or v in side.grad):
                e = _rc.summed_slice(rule, a, k.dim, _rc.STRICT if strict else _rc.RESHARDED, op)
                if strict:
                    _raise(e)
                if isinstance(e, SpmdTypeError) and rule == "psum":
                    # (a psum_scatter's result is sharded over the axis anyway: no tell)
                    side.summed[o] = side.summed.get(o, ()) + (
                        Summed(a, e, where, side.lineage.get(v, 0)),)
        if rule in _rc.SUMMING and not quiet:
            _residual(v, rule, axes, side, env, where, report)
    if rule == "psum":
        # a psum of a Shard over its axis is SPMD108 (in the rule) for gradients only: for a
        # value the in_specs shard, a spec cannot tell a slice of a global array from a stack
        # of per-device terms (F5): `at_outputs` decides
        sums = set(axes)
        refs = [r.with_grad(True) if (not is_literal(v) and v in side.grad) else
                Refinement.of({a: k for a, k in r.items
                               if not (a in sums and isinstance(k, Shard))}, r.data)
                for v, r in zip(eqn.invars, refs, strict=True)]
    return refs


def _replicated(v: Any, axis: str, side: Side) -> str | None:
    """What `v` is when it is a term replicated over `axis` that carries data: "an Invariant
    value", "a gathered value", "a replicated value"; None otherwise (a constant, a zero, a
    share pre-divided by the axis size, a value that varies there)."""
    if is_literal(v) or side.is_constant(v) or side.is_zero(v) or axis in side.prescaled(v):
        return None
    t = var_type(v, side.types)
    if axis not in t.varying:
        return None if axis in t.unreduced or axis in t.reduced else "an Invariant value"
    if axis in side.same.get(v, ()):
        return "a gathered value" if axis in side.gathered.get(v, ()) else "a replicated value"
    return None


def residual_terms(v: Any, side: Side) -> tuple[Any, str, tuple[Any, ...]] | None:
    """What the residual check of a reduction of `v` (`_residual`) reads: the equation whose
    result the reduction takes through reshapes and casts (`_THROUGH`), its primitive and its
    two terms (the buffer first, then the contributions for a scatter-add); None when it is no
    sum of two terms (nothing to check). The walk's memo of whole equations keys a reduction
    on the terms' facts (`transfer.key`)."""
    e = side.defining(v)
    while e is not None and _compat.primitive_name(e) in _THROUGH and e.invars \
            and not is_literal(e.invars[0]):
        e = side.defining(e.invars[0])
    if e is None:
        return None
    prim = _compat.primitive_name(e)
    if prim in ("add", "add_any", "sub") and len(e.invars) == 2:
        return e, prim, (e.invars[0], e.invars[1])
    if prim in ("scatter-add", "scatter_add") and len(e.invars) >= 3:
        return e, prim, (e.invars[0], e.invars[2])
    return None


def _residual(v: Any, rule: str, axes: Sequence[str], side: Side, env: dict[Any, Refinement],
              where: Any, report: Report) -> None:
    """SPMD210 at the `add` (or the scatter-add into a buffer) whose result the reduction takes
    (through reshapes and casts), when one term (the buffer) is replicated over a reduced axis
    and the other (the updates) per-device contributions (`accum`)."""
    got = residual_terms(v, side)
    if got is None:
        return
    e, prim, (a0, a1) = got
    # (a scatter-add's contributions are scatter-added into a residual: one pair)
    pairs = [(a0, a1)] if prim.startswith("scatter") else [(a0, a1), (a1, a0)]
    for a in axes:
        for u, x in pairs:
            what = _replicated(u, a, side)
            if what is None or is_literal(x):
                continue
            # per-device contributions (a Partial's is the elementwise rule's): a plain value's
            # sum may be meant (a stack of per-device terms plus n copies)
            if a not in side.accum.get(x, ()) or env.get(x, _r.NONE).get(a) is PARTIAL:
                continue
            err = _rc.residual_before_reduction(rule, a, what, api_name(prim))
            if isinstance(err, SpmdTypeError):
                frames = _compat.eqn_frames(e)
                report(err, user_frame(frames) or where, primitive_detail(prim, frames))
            return


def track(view: EqnView, refs: Sequence[Refinement], results: Sequence[Refinement], side: Side,
          where: Any, *, quiet: bool, report: Report) -> None:
    """The content facts of the outputs of the equation `view` (see the module docstring), and
    SPMD213 for a slice of per-device contributions at this device's `axis_index`."""
    eqn, name, ins, outs = view.eqn, view.name, view.ins, view.outs
    invars, outvars = eqn.invars, eqn.outvars
    if name == "optimization_barrier":   # each output is its input, unchanged
        for v, o in zip(invars, outvars, strict=True):
            side.seed(o, side.export(v))
        return
    # the operands that are values (not literals), in one pass: their sums, lineage, facts
    vin = [(v, t) for v, t, lit in zip(invars, ins, view.lits, strict=True)
           if t is not LITERAL and not lit]
    summed: tuple[Any, ...] = ()
    lineage = 0
    facts = False
    for v, _ in vin:
        sums = side.summed.get(v)
        if sums:
            summed += sums
        lineage |= side.lineage.get(v, 0)
        facts = facts or v in side.same or v in side.sliced or v in side.accum \
            or v in side.own or v in side.unsure
    moved: frozenset[str] = frozenset().union(
        *(side.moved.get(v, frozenset()) for v, _ in vin)) if side.moved else frozenset()
    if summed and view.subs and name not in _CONTROL:
        # a call's outputs were seeded from its body's walk, which saw its blocks completed
        summed = tuple(x for x in summed if not isinstance(x, Block))
    elif summed and (name in _rc.COMBINING or view.subs):
        summed = _complete_blocks(view, summed, vin, side)
    if summed:
        for o in outvars:
            side.summed[o] = tuple(dict.fromkeys(side.summed.get(o, ()) + summed))
    if lineage:
        for o in outvars:
            side.lineage[o] = side.lineage.get(o, 0) | lineage
    if moved:
        for o in outvars:
            side.moved[o] = side.moved.get(o, frozenset()) | moved
    if (name == "dot_general" or name in _rc.PAIRING) and not quiet and len(vin) == 2:
        _diagonal_blocks(view, refs, side, where, lineage)
    if name not in STRUCTURAL and view.subs:
        return   # a call's outputs are seeded from its body (`Side.seed`); a scatter's
        # combiner is no call
    rule = _surface.AXIS_PRIMITIVES.get(name)
    if rule is not None:
        _after_collective(view, rule, results, side)
        return
    seen = frozenset().union(*(t.varying | side.unsure.get(v, frozenset()) for v, t in vin))
    for o, t in zip(outvars, outs, strict=False):
        if seen - t.varying:
            side.unsure[o] = seen - t.varying
    if not facts and name not in _FROM_NOTHING:
        return   # no operand carries a content fact and this op makes none
    if name in ("dynamic_slice", "gather") and len(invars) > 1 and not is_literal(invars[0]) \
            and not quiet:
        idx = ins[1:] if name == "dynamic_slice" else ins[1:2]
        irefs = refs[1:] if name == "dynamic_slice" else refs[1:2]
        for a in sorted(ins[0].varying):
            if any(_r.kind(t, r, a) is INDEX for t, r in zip(idx, irefs, strict=True)) and \
                    (a in side.accum.get(invars[0], ()) or refs[0].get(a) is PARTIAL):
                err = _rc.sliced_contributions(a, api_name(name))
                if isinstance(err, SpmdTypeError):
                    report(err, where, primitive_detail(name, view.frames))
                break
    # the operands' facts as unions (set algebra, not a scan per axis): an output varying on
    # `a` is `same` there when every operand varying there is
    empty: frozenset[str] = frozenset()
    varies = not_same = gathered_in = sliced_in = accum_in = empty
    for v, ti in vin:
        same_v = side.same.get(v, empty)
        varies, not_same = varies | ti.varying, not_same | (ti.varying - same_v)
        gathered_in |= side.gathered.get(v, empty)
        sliced_in |= side.sliced.get(v, empty)
        accum_in |= side.accum.get(v, empty)
    slicing = name in ("dynamic_slice", "gather")
    for o, t, r in zip(outvars, outs, results, strict=False):
        same = (t.varying & varies) - not_same
        gathered = same & gathered_in
        sliced = frozenset(a for a in t.varying if isinstance(r.get(a), Shard) and (
            a in sliced_in or slicing and (_r.kind(ins[0], refs[0], a) is FIXED
                                          or refs[0].get(a) is _r.REP)))
        if name in ("scatter-add", "scatter_add") and len(invars) >= 3 \
                and side.is_zero(invars[0]) and not is_literal(invars[2]) \
                and jnp.issubdtype(invars[2].aval.dtype, jnp.inexact):
            upd = invars[2]
            accum = frozenset(a for a in t.varying if a in ins[2].varying
                              and a not in side.same.get(upd, ()))
        elif name in ("ragged_dot_general", "ragged_dot") and len(invars) >= 2 \
                and len(refs) >= 2 and len(shapes_of(invars[1])) == 3:
            # the rows this device's experts (the rhs's group dim, sharded over `a`) computed
            accum = frozenset(a for a in t.varying if refs[1].get(a) == Shard(-3))
        elif name in _LINEAR:
            accum = t.varying & accum_in
        elif accum_in and jnp.issubdtype(o.aval.dtype, jnp.inexact):
            accum = _own_term(t.varying & accum_in, vin, side)
        else:
            accum = empty
        if name in ("dot_general", "mul") and len(vin) == 2:
            # the group's gathered values times this device's expert weight: its contributions
            (u, _), (w, _) = vin
            own_same = (side.own.get(u, empty) & side.same.get(w, empty)) \
                | (side.own.get(w, empty) & side.same.get(u, empty))
            accum |= t.varying & own_same
        own = _own(name, eqn, vin, refs, t, side)
        for key, got in (("same", same), ("gathered", gathered), ("sliced", sliced),
                         ("accum", accum), ("own", own)):
            if got:
                getattr(side, key)[o] = got


def _complete_blocks(view: EqnView, summed: tuple[Any, ...], vin: list[tuple[Any, SpmdType]],
                     side: Side) -> tuple[Any, ...]:
    """`summed` (the union of the operands' sums and blocks) without the diagonal blocks this
    equation completes: an op that combines values (`_rc.COMBINING`) one operand of which is
    another block of the same product (`_completes`: the next step of a ring, the collective
    matmul's next update; not a residual stream an earlier layer's all-gather brought data
    into), or a loop or branch whose body brings other devices' data in over the block's axis
    (a ring in a `scan` started from the local block)."""
    blocks = [b for b in summed if isinstance(b, Block)]
    if not blocks:
        return summed
    if view.subs:
        inside = _moving_axes(view.subs)
        done = {id(b) for b in blocks if b.axis in inside}
    else:
        done = {id(b) for b in blocks if any(_completes(b, v, side) for v, _ in vin)}
    return tuple(x for x in summed if id(x) not in done) if done else summed


def blocks_out(outvars: Sequence[Any], out_facts: Sequence[tuple[Any, ...]],
               bodies: Sequence[Any], side: Side) -> None:
    """The diagonal blocks made inside a loop's or a branch's body (`bodies`) that reach its
    outputs (`out_facts`, the body's walk's), carried to the equation's `outvars`: a scan over
    layers whose attention forgets the ring. Not over an axis the body brings other devices'
    data in over (a ring inside the loop completes its blocks across iterations, which one walk
    of the body does not see)."""
    inside: frozenset[str] | None = None
    for o, f in zip(outvars, out_facts, strict=False):
        made = [b for b in exported_sums(f) if isinstance(b, Block)]
        if not made:
            continue
        if inside is None:
            inside = _moving_axes(bodies)
        made = [b for b in made if b.axis not in inside]
        if made:
            side.summed[o] = tuple(dict.fromkeys(side.summed.get(o, ()) + tuple(made)))


def _moving_axes(jaxprs: Sequence[Any]) -> frozenset[str]:
    """The axes over which the collectives of `jaxprs` (and of the jaxprs they hold) bring
    other devices' data in (`_rc.MOVING`)."""
    got: set[str] = set()
    for jp in jaxprs:
        for e in getattr(jp, "jaxpr", jp).eqns:
            name = _compat.primitive_name(e)
            if _surface.AXIS_PRIMITIVES.get(name) in _rc.MOVING:
                got.update(eqn_axes(e))
            got |= _moving_axes(_compat.sub_jaxprs(e))
    return frozenset(got)


def _completes(b: Block, v: Any, side: Side) -> bool:
    """Whether the value `v`, combined with the block `b`, is another block of the same
    product: other devices' data was brought into it over the block's axis (`moved`), it is
    not computed from `b`, and it is computed from every input `b`'s operands are (read in the
    walk that made `b`, where both lineages name the same inputs; elsewhere the first two
    suffice). A residual stream that an earlier layer brought data into lacks the later
    layer's weights."""
    if b.axis not in side.moved.get(v, ()) or b in side.summed.get(v, ()):
        return False
    return b.made_in != side.serial or (side.lineage.get(v, 0) & b.sources) == b.sources


def _diagonal_blocks(view: EqnView, refs: Sequence[Refinement], side: Side, where: Any,
                     sources: int) -> None:
    """The diagonal blocks (SPMD216) the `dot_general` of `view` makes (`apart_shards`), or
    its elementwise op of two operands broadcast against each other (`PAIRING`,
    `apart_broadcasts`: their extents as `Side.effective` reads them), added to its result's
    `summed` (`Block`); `sources` is the operands' lineage, which the caller has read."""
    eqn, ins, shapes, name = view.eqn, view.ins, view.shapes, view.name
    if len(shapes) != 2 or len(refs) != 2:
        return
    axes = view.outs[0].varying
    if name == "dot_general":
        spec = dot_spec(eqn.params["dimension_numbers"], len(shapes[0]), len(shapes[1]))
        args = [_r.Arg(ins[0], refs[0], shapes[0]), _r.Arg(ins[1], refs[1], shapes[1])]
        found = _rc.apart_shards(spec, args, axes)
    else:
        found = _rc.apart_broadcasts(
            [_r.Arg(t, r, side.effective(v, s))
             for v, t, r, s in zip(eqn.invars, ins, refs, shapes, strict=True)], axes)
    made = []
    for axis, left, right in found:
        e = _rc.diagonal_block(axis, (left, right), api_name(name))
        if isinstance(e, SpmdTypeError):
            made.append(Block(axis, e, where, name, sources, side.serial))
    if made:
        o = eqn.outvars[0]
        side.summed[o] = side.summed.get(o, ()) + tuple(made)


def _own_term(axes: frozenset[str], vin: list[tuple[Any, SpmdType]], side: Side
              ) -> frozenset[str]:
    """The axes of `axes` over which an op's floating output is still this device's term of a
    sum (`accum`): one operand is such a term there, and every other operand varying there is
    the same on every device or this device's member (`gelu(x_all @ w[0]) @ w2[0]`: this
    device's expert on the gathered tokens, a function of its term alone)."""
    empty: frozenset[str] = frozenset()
    out = set()
    for a in axes:
        terms = [v for v, _ in vin if a in side.accum.get(v, empty)]
        if len(terms) == 1 and all(
                v is terms[0] or a not in ti.varying or a in side.same.get(v, empty)
                or a in side.own.get(v, empty) for v, ti in vin):
            out.add(a)
    return frozenset(out)


def _own(name: str, eqn: Any, vin: list[tuple[Any, SpmdType]], refs: Sequence[Refinement],
         t: SpmdType, side: Side) -> frozenset[str]:
    """The axes over which `eqn`'s output is this device's member of an in_spec stack: a
    squeeze of a dim sharded over the axis (one member per device), and the reshapes and
    casts of one."""
    if name == "squeeze" and vin and refs:
        ndim = len(shapes_of(vin[0][0]))
        dims = {d % ndim for d in eqn.params.get("dimensions", ())} if ndim else set()
        return frozenset(a for a in t.varying if isinstance(k := refs[0].get(a), Shard)
                         and k.dim % ndim in dims)
    if name in _THROUGH and vin:
        return frozenset(a for a in t.varying if a in side.own.get(vin[0][0], ()))
    return frozenset()


def shapes_of(v: Any) -> tuple[int, ...]:
    return () if is_literal(v) else tuple(getattr(v.aval, "shape", ()) or ())


def _after_collective(view: EqnView, rule: str, results: Sequence[Refinement], side: Side
                      ) -> None:
    eqn, outs, axes = view.eqn, view.outs, frozenset(view.axes)
    empty: frozenset[str] = frozenset()
    for v, o, t, r in zip(eqn.invars, eqn.outvars, outs, results, strict=False):
        # the facts the collective keeps: those of the other axes (JAX's pvary over `dp` of
        # an expert's term over `ep` is still that term)
        kept = {} if is_literal(v) else {k: (getattr(side, k)[v] - axes) & t.varying
                                         for k in _KEPT if v in getattr(side, k)}
        same, gathered, sliced = (kept.get(k, empty) for k in ("same", "gathered", "sliced"))
        if rule == "all_gather":
            same, gathered = same | (axes & t.varying), gathered | (axes & t.varying)
        elif rule in ("pvary", "pcast_varying"):
            unsure = frozenset() if is_literal(v) else side.unsure.get(v, frozenset())
            same = same | (axes & t.varying - unsure)
        elif rule == "psum_scatter":
            sliced = sliced | frozenset(a for a in axes if isinstance(r.get(a), Shard))
        kept.update(same=same, gathered=gathered, sliced=sliced)
        if rule in _rc.MOVING:
            side.moved[o] = side.moved.get(o, frozenset()) | axes
        for key, got in kept.items():
            if got:
                getattr(side, key)[o] = got


def spec_axes(spec: Any) -> frozenset[str]:
    """The mesh axes a PartitionSpec partitions over."""
    entries = getattr(spec, "partitions", None)
    entries = tuple(entries) if entries is not None else tuple(spec or ())
    return frozenset(a for e in entries if e is not None
                     for a in ((e,) if isinstance(e, str) else tuple(e)))


def at_outputs(outvars: Sequence[Any], out_facts: Sequence[tuple[Any, ...]],
               out_specs: Sequence[Any], in_specs: Sequence[Any], report: Report,
               types: Any = None) -> None:
    """SPMD108 for each psum of an in_spec Shard over an axis `a` when an output computed
    from it varies over `a`, its out_spec shards it over `a`, and it combines the sum with
    another input sharded over `a` (an optimizer step: `p - lr * pmean(g, ("dp", "fsdp"))`
    with `p` and `g` both `P("fsdp")`): the program maps arrays sharded over `a` to one
    sharded over `a`, the summed value was a slice of one. Not when the sum is combined only
    with its own operand's inputs (`x - pmean(x, a)`: a stack's mean per position) or
    returned as is (n tiled copies). SPMD216 for each diagonal block (`Block`) an output is
    computed from, once."""
    blocks: set[int] = set()
    for v, facts, spec in zip(outvars, out_facts, out_specs, strict=False):
        summed = exported_sums(facts)
        if not summed or is_literal(v):
            continue
        for b in summed:
            if isinstance(b, Block) and id(b) not in blocks:
                blocks.add(id(b))
                report(b.error, b.where, f"primitive: {b.primitive}")
        varying = var_type(v, types).varying
        names = spec_axes(spec)
        lineage: int = facts[5][CONTENT.index("lineage")] or 0
        for s in summed:
            if isinstance(s, Block):
                continue
            rest = lineage & ~s.sources
            others = [i for i in range(min(rest.bit_length(), len(in_specs)))
                      if rest >> i & 1 and s.axis in spec_axes(in_specs[i])]
            if s.axis in names and s.axis in varying and others:
                report(s.error, s.where, "primitive: psum")


def input_facts(invars: Sequence[Any]) -> list[tuple[Any, ...]]:
    """The side facts of the shard_map body's inputs: each is its own lineage."""
    empty: frozenset[str] = frozenset()
    at = CONTENT.index("lineage")
    content: list[Any] = [empty] * len(CONTENT) + [()]
    out = []
    for i, _ in enumerate(invars):
        content[at] = 1 << i
        out.append((False, False, empty, empty, False, tuple(content)))
    return out


def localized(facts: Sequence[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """A call's operands' facts (`Side.export`) as its nested jaxpr's inputs: each operand's
    lineage is its own position, so that the walk of the jaxpr (and its memo) reads nothing
    of the caller's inputs; `globalized` maps its outputs' lineage back."""
    at = CONTENT.index("lineage")
    out = []
    for i, f in enumerate(facts):
        content = f[5]
        if content:
            content = (*content[:at], 1 << i, *content[at + 1:])
        out.append((*f[:5], content))
    return out


def sums_made(out_facts: Sequence[tuple[Any, ...]], facts: Sequence[tuple[Any, ...]]) -> bool:
    """Whether a call's outputs carry a sum of in_spec Shards made inside it (not one of its
    operands' `facts`)."""
    given = {id(s) for f in facts for s in exported_sums(f)}
    return any(id(s) not in given for f in out_facts for s in exported_sums(f))


def globalized(out_facts: Sequence[tuple[Any, ...]], facts: Sequence[tuple[Any, ...]]
               ) -> list[tuple[Any, ...]]:
    """The facts of a call's outputs (walked on `localized(facts)`) in the caller's terms: the
    lineage, and the sources of each sum made inside the call, of the operands they name."""
    at = CONTENT.index("lineage")
    lineages = [f[5][at] if f[5] else 0 for f in facts]
    given = {id(s) for f in facts for s in exported_sums(f)}

    def remap(bits: int) -> int:
        got = 0
        while bits:
            low = bits & -bits
            got |= lineages[low.bit_length() - 1]
            bits ^= low
        return got

    out = []
    for f in out_facts:
        content = f[5]
        if content:
            summed = tuple(s if id(s) in given else dataclasses.replace(s, sources=remap(s.sources))
                           for s in exported_sums(f))
            content = (*content[:at], remap(content[at]), *content[at + 1:len(CONTENT)], summed)
        out.append((*f[:5], content))
    return out
