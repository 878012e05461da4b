"""The refinement walk of `infer`: Shard / Partial / Rep over a traced jaxpr (issue 15, item 7).

JAX's avals carry the four states only, so `infer` keeps its own environment: a `Refinement`
per jaxpr variable, seeded from the in_specs (`refine_shape.from_spec`) and propagated
equation by equation with the pure rules of `_rules.refine` / `_rules.refine_shape`. Nested
jaxprs (jit, custom_jvp/vjp, remat, cond, while, scan) are walked with their arguments'
refinements mapped in; loops iterate to a fixed point (refinements only shrink). Unknown
primitives give plain Varying: never a new false error.

Besides the refinement rules' own errors (SPMD108, SPMD21x; SPMD216, the diagonal blocks of
`refine_content`, reported at the outputs) at the equation's user line, the
walk reports what only a jaxpr shows:

- SPMD303 `varying-predicate`: a raw `cond`/`while_loop` whose predicate varies over an axis
  while JAX types a result Invariant there (jax#40823: the gradient reduces inside the
  divergent branches);
- SPMD408 `opaque-drops-axis`: an opaque computation (a callback, an FFI call, or a call of
  one) whose output is less varying than its inputs: JAX types a per-device result replicated
  (jax-finufft#226), reported at the outermost call the user wrote;
- SPMD407 `vmap-grad-invariant` and the cotangents' refinements, read from the jaxpr
  (`gradients`): a gradient the body computes is typed by the cotangent rule of its primal
  (Rep <-> Partial, Shard kept) instead of by walking the transposed equations (which lose
  the Shard at any constant index); the psum JAX inserts into `jax.vmap(jax.grad(f))` of a
  parameter Invariant where the loss varies is SPMD407 at the `jax.vmap` line.

A few correct idioms that the strict runtime rules reject need the typed program's opt-outs;
the walk of a raw program cannot see those, so it accepts them where the jaxpr says which one
is meant (docs/design/shard_partial.md, F1-F6): a non-linear op on a partial sum whose only
use is `pmax`/`pmin` (a per-shard statistic), a partial sum plus a constant built in the
program (a regulariser such as `eps * eye`), a replicated term divided by the axis size
(the pre-divided bias), and per-example gradients summed over the batch right away.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import _compat, _rules, _surface
from .._errors import SpmdTypeError
from .._rules import LITERAL, SpmdType
from .._rules import refine as _r
from .._rules.refine import FIXED, INDEX, NONE, PARTIAL, REP, Arg, Refinement, Shard
from .._rules.refine import shape as _rs
from . import gradients as _gradients
from . import refine_content as _content
from . import transfer as _transfer
from .eqns import EqnView, Views
from .frames import primitive_detail
from .primitives import CALLS, KEEPS_SHARE, KNOWN_PLAIN, STRUCTURAL
from .refine_facts import (
    Side,
    api_name,
    constant_share,
    cut_from_a_table,
    diverged,
    drop_leading,
    in_refinements,
    is_literal,
    track_side,
    var_type,
)
from .refine_pending import (
    Pending,
    excused,
    opaque_call_pending,
    opaque_pending,
    per_example_error,
    varying_predicate_error,
)
from .refine_pure import PURE, pure_rule
from .walk import call_site

Where = "tuple[str, int] | None"
Report = Callable[[SpmdTypeError, Any, str], None]

@dataclasses.dataclass
class RefineWalk:
    """Walks a jaxpr with refinements; `report(e, where, extra)` receives each violation."""

    report: Report
    axis_sizes: dict[str, int]
    #: var -> the scalar constant it holds (a literal cast by JAX: `pvary 4.0`), for `_share`
    scalars: dict[Any, object] = dataclasses.field(default_factory=dict)
    #: the pure rules' memo (`_pure`, `_elementwise`): their inputs -> their results
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict)
    #: `st.shard_map(..., strict=True)`: every sum of an in_spec Shard over its axis is SPMD108
    strict: bool = False
    #: the in_specs / out_specs of the body's inputs and outputs (`refine_content`)
    in_specs: Sequence[Any] = ()
    out_specs: Sequence[Any] = ()
    #: the nested jaxprs walked with nothing reported, by `Views.shape`, operands'
    #: refinements and facts: a jaxpr many calls share (`jax.nn.relu`'s jit, once per layer),
    #: or that JAX traces anew at each call (its `custom_jvp`), is walked once
    calls: dict[Any, Any] = dataclasses.field(default_factory=dict)
    #: how many violations `report` received
    reported: int = 0
    #: a loop's first pass (`_fixed_point`): violations are counted, not reported
    muted: bool = False
    #: the states read instead of JAX's (`refine_facts.var_type`): a `check_vma=False`
    #: program's (`check_unchecked`), whose values JAX types Invariant
    types: Any = None
    #: each equation's static facts, read once (shared with the state walk of the same check)
    views: Views = dataclasses.field(default_factory=Views)
    #: the memo of whole equations (`transfer`): what they read -> what they wrote
    transfer: dict[Any, Any] = dataclasses.field(default_factory=dict)
    #: what the walk knows of a value (refinement, side facts, known scalar) -> its number
    #: (`transfer.fact_id`): equal values the walk cannot tell apart share one
    known: dict[Any, int] = dataclasses.field(default_factory=dict)

    def _report(self, e: SpmdTypeError, where: Any, extra: str) -> None:
        """`report`, counted (`reported`), unless `muted` (still counted: an equation that
        found a violation is never memoized). (A method, not a closure stored on the walk: that
        would make the walk and everything it holds cyclic garbage, freed only by the next
        collection.)"""
        self.reported += 1
        if not self.muted:
            self.report(e, where, extra)

    # ------------------------------------------------------------------ entry points

    def top(self, jaxpr: Any, in_refs: Sequence[Refinement]) -> list[Refinement]:
        """Walk the shard_map body `jaxpr` whose inputs have `in_refs`; the outputs' refs."""
        outs, pending = self.jaxpr(jaxpr, list(in_refs), parent=None, quiet=False,
                                   facts=_content.input_facts(jaxpr.invars))
        for p in pending:   # reaching the body's outputs: nothing will excuse them
            self._report(p.error, p.where, p.extra)
        _content.at_outputs(jaxpr.outvars, self.out_facts, self.out_specs, self.in_specs,
                            self._report, self.types)
        return outs

    # ------------------------------------------------------------------ jaxprs

    def jaxpr(self, jaxpr: Any, in_refs: Sequence[Refinement], *, parent: Any, quiet: bool,
              facts: Sequence[tuple[Any, ...]] | None = None
              ) -> tuple[list[Refinement], list[Pending]]:
        """Walk one (open) jaxpr. Returns the outputs' refinements and the pending violations
        that reach its outputs (the caller decides about them); `self.out_facts` are the
        outputs' side facts (`Side.export`), `facts` the inputs'."""
        env: dict[Any, Refinement] = {}
        side = Side()
        side.types = self.types
        side.eqns = jaxpr.eqns
        for v in jaxpr.constvars:
            env[v] = NONE
            side.const.add(v)
        for v, r in zip(jaxpr.invars, in_refs, strict=False):
            env[v] = r
        for v, f in zip(jaxpr.invars, facts or (), strict=False):
            side.seed(v, f)
        pending: dict[Any, Pending] = {}
        views = self.views.all(jaxpr)
        grads = _gradients.read(views, jaxpr.outvars)
        typed: dict[int, Any] = {}
        links, link_at = grads.links, grads.at
        fast = not grads.batched
        replay, memo, known, scalars = _transfer.replay, self.transfer, self.known, self.scalars
        for view in views:
            # an equation of a repeated layer: replayed in one pass (`transfer.replay`)
            if fast and view.replay:
                q = quiet or view.autodiff(parent)
                if (q or not view.summing) and replay(view, q, env, side, scalars, pending,
                                                      known, memo):
                    if view.carries:
                        self._carry(view)
                else:
                    self.eqn(view, env, side, pending, grads, parent=parent, quiet=quiet)
            else:
                self.eqn(view, env, side, pending, grads, parent=parent, quiet=quiet)
            if link_at:
                for v in link_at.get(view, ()):
                    _gradients.type_gradient(v, links[v], env, side, typed)
        outvars = [v for v in jaxpr.outvars if not is_literal(v)]
        left: list[Pending] = []
        uses: dict[Any, list[Any]] = {}
        if pending and not quiet:   # the uses of the values pending violations are about
            for eqn in jaxpr.eqns:
                for v in eqn.invars:
                    if not is_literal(v) and v in pending:
                        uses.setdefault(v, []).append(eqn)
        for v, p in pending.items():
            if quiet:
                continue
            if any(o is v for o in outvars):
                left.append(p)
                continue
            if excused(p, uses.get(v, [])):
                continue
            self._report(p.error, p.where, p.extra)
        outs = [NONE if is_literal(v) else env.get(v, NONE) for v in jaxpr.outvars]
        self.out_facts = [side.export(v) for v in jaxpr.outvars]
        return outs, left

    # ------------------------------------------------------------------ one equation

    def eqn(self, view: EqnView, env: dict[Any, Refinement], side: Side,
            pending: dict[Any, Pending], grads: _gradients.Gradients, *, parent: Any,
            quiet: bool) -> None:
        """One equation: replayed (`transfer`) when an equation with the same static facts was
        walked before with the same operands' facts, else its rules run (`_walk`)."""
        batched = bool(grads.batched)
        # (read before `quiet` turns on for autodiff: the per-example sum is a transposed
        # equation; `key` is None for every equation of a batched jaxpr)
        summing = not quiet and batched
        if view.autodiff(parent):
            # a tangent or transposed equation: the gradients it computes are typed by the
            # cotangent rule of their primals (`gradients`), not by walking what JAX
            # generated (class 7, G5)
            quiet = True
        static = view.key if not view.subs else \
            self.views.call_key(view) if view.name in CALLS else None
        key = _transfer.key(view, static, env, side, self.scalars, pending, self.known,
                            quiet=quiet, batched=batched)
        recorded = False
        # (replayed: an equation walked before, with the same operands' facts)
        if not _transfer.replayed(view, key, self.transfer, env, side):
            summed = summing and _gradients.per_example_sum(view, grads)
            reported, waiting = self.reported, len(pending)
            self._walk(view, env, side, pending, view.user or parent, quiet, summed)
            recorded = key is not None and reported == self.reported and waiting == len(pending)
        if view.carries:
            self._carry(view)
        if recorded:   # (after the scalars its results hold: part of what is recorded)
            got = _transfer.record(view, env, side, self.scalars, self.known)
            if got is not None:
                self.transfer[key] = got

    def _carry(self, view: EqnView) -> None:
        """The results of a `CARRY_SCALARS` cast hold the scalar constant its operand holds
        (`_scalar`, read from the view)."""
        eqn = view.eqn
        if eqn.invars:
            value = view.values[0] if view.lits[0] else self.scalars.get(eqn.invars[0])
            if value is not None:
                for v in eqn.outvars:
                    self.scalars[v] = value

    def _walk(self, view: EqnView, env: dict[Any, Refinement], side: Side,
              pending: dict[Any, Pending], where: Any, quiet: bool, summed: bool) -> None:
        """The rules of one equation: its results' refinements and side facts, its violations
        reported (or left pending)."""
        eqn, name, ins, outs = view.eqn, view.name, view.ins, view.outs
        refs = [NONE if lit else env.get(v, NONE) for v, lit in zip(eqn.invars, view.lits,
                                                                     strict=True)]
        op = name
        results: Sequence[Refinement] | None = None
        try:
            results = self._rule(view, refs, env, side, pending, where, quiet)
        except SpmdTypeError as e:
            excused = self._excuse_now(e, eqn, name, ins, refs, side)
            if excused is not None:
                results = [excused.restrict(outs[0].varying)] if outs else []
            elif not quiet:
                if e.code == "SPMD211" and eqn.outvars:   # a per-shard statistic if only pmax'd
                    pending[eqn.outvars[0]] = Pending(e, where, primitive_detail(op, view.frames),
                                                      "nonlinear")
                else:
                    self._report(e, where, primitive_detail(op, view.frames))
        if results is None:
            results = [NONE] * len(outs)
        if summed:   # jax.vmap(jax.grad(f)) w.r.t. a parameter Invariant where the loss varies
            found = per_example_error(outs[0], view.axes)
            if found is not None:
                pending[eqn.outvars[0]] = Pending(found, call_site(view.frames, "vmap") or where,
                                                   "jax.grad under jax.vmap", "per_example")
        data = any(r.data for r in refs)
        if name in KEEPS_SHARE and refs and refs[0].share and len(results) == 1:
            # `b / n` broadcast against the partial sum, or cast by JAX: still b's share
            results = [_r.with_share(results[0], outs[0], refs[0].share)]
        if name == "slice" and len(results) == 1 and cut_from_a_table(side, eqn):
            data = True   # a table built for a longer extent, cut (`cut_from_a_table`)
        track_side(side, eqn, name, self.axis_sizes)
        _content.track(view, refs, results, side, where, quiet=quiet, report=self._report)
        for v, t, r in zip(eqn.outvars, outs, results, strict=False):
            env[v] = r.restrict(t.varying).with_data(r.data or data)
        # opaque values cast back to Varying on the axes they dropped; a per-example gradient
        # cast back by JAX after its sum (the uses of the cast decide)
        if name in ("pvary", "reduced_vary_cast") or _surface.AXIS_PRIMITIVES.get(name) == "pvary":
            for v in eqn.invars:
                p = None if is_literal(v) else pending.get(v)
                if p is not None and p.kind == "opaque" and p.axes <= outs[0].varying:
                    del pending[v]
                elif p is not None and p.kind == "per_example" and eqn.outvars:
                    pending[eqn.outvars[0]] = pending.pop(v)

    def _rule(self, view: EqnView, refs: Sequence[Refinement], env: dict[Any, Refinement],
              side: Side, pending: dict[Any, Pending], where: Any, quiet: bool
              ) -> Sequence[Refinement] | None:
        eqn, name, ins, outs = view.eqn, view.name, view.ins, view.outs
        shapes, out_shape = view.shapes, view.out_shape
        if name in _surface.AXIS_PRIMITIVES:   # its operands' content first (`refine_content`)
            refs = _content.at_collective(view, refs, side, env, where, quiet=quiet,
                                          strict=self.strict, report=self._report)
            return _not_rep_where_unsure(self._pure(view, refs), eqn.invars, side)
        kind = _surface.PRIMITIVE_REFINE.get(name, (None, name))[0]
        if name in PURE or kind in ("reduction", "along"):
            return self._pure(view, refs)
        if kind == "elementwise":
            return [self._elementwise(eqn, name, ins, outs[0], refs, shapes, out_shape, side)]
        if name == "cond":
            return self._cond(eqn, ins, outs, refs, where, quiet, pending, side)
        if name == "while":
            return self._while(eqn, ins, outs, refs, where, quiet, pending, side)
        if name == "scan":
            return self._scan(eqn, outs, refs, shapes, where, quiet, pending, side)
        if name == "shard_map":
            return None
        if view.subs:
            return self._call(eqn, view.subs, ins, outs, refs, where, quiet, pending, side)
        if name not in STRUCTURAL and name not in KNOWN_PLAIN and not quiet:
            opaque_pending(eqn, name, ins, outs, where, pending)
        return None

    def _pure(self, view: EqnView, refs: Sequence[Refinement]) -> Sequence[Refinement]:
        """The rule of an equation whose result depends only on the primitive, its params and
        its operands' types, refinements and shapes (`PURE`: collectives, structural ops,
        reductions): memoized per walk, so a program's repeated layers pay for each distinct
        equation once. A rule's error is never memoized (raised again at each equation)."""
        static = view.key
        key = None if static is None else (static, *refs)
        got = None if key is None else self.memo.get(key)
        if got is not None:
            return got  # type: ignore[no-any-return]
        res = tuple(pure_rule(view.eqn, view.name, view.ins, view.outs, refs, view.shapes,
                              view.out_shape))
        if key is not None:
            self.memo[key] = res
        return res

    # ------------------------------------------------------------------ families

    def _elementwise(self, eqn: Any, name: str, ins: Sequence[Any], out: SpmdType,
                     refs: Sequence[Refinement], shapes: Sequence[tuple[int, ...]],
                     out_shape: tuple[int, ...], side: Side) -> Refinement:
        rule = _rules.PRIMITIVES.get(name, name)
        if name == "stop_gradient":
            rule = "stop_gradient"
        # the extent each operand really has along each dim: 1 where it was broadcast there;
        # a scalar constant JAX cast itself (the auto-pvary of a literal) is that literal
        eff = [side.effective(v, s) for v, s in zip(eqn.invars, shapes, strict=True)]
        ins = [LITERAL if (not is_literal(v) and side.is_constant(v) and not s) else t
               for v, t, s in zip(eqn.invars, ins, shapes, strict=True)]
        args = [Arg(t, r, e) for t, r, e in zip(ins, refs, eff, strict=True)]
        onehot_fill = False
        if name == "select_n":
            if len(args) != 3:
                return NONE
            args = [args[0], args[2], args[1]]     # where(pred, on_true, on_false)
            onehot_fill = side.is_zero(eqn.invars[1])
            rule = "where"
        side.after_elementwise(eqn, name)
        key = ("elementwise", rule, tuple(args), out, name, len(out_shape), onehot_fill)
        res = self.memo.get(key)
        if res is None:   # the rule is pure (see `_pure`); a rule's error is never memoized
            res = _r.elementwise(rule, args, out, op=api_name(name), out_ndim=len(out_shape),
                                 onehot_fill=onehot_fill)
            res = _r.with_across(res, refs)
            self.memo[key] = res
        share = self._share(name, eqn.invars)
        if share is not None:
            res = _r.with_share(res, ins[share[0]], share[1])
        if rule == "where":
            # a choice between offsets derived from axis_index(a) (JAX's clamp of a dynamic
            # index) is still derived from it
            idx = {a for a in out.varying
                   if {_r.kind(x.type, x.ref, a) for x in args[1:]} - {FIXED} == {INDEX}}
            if idx:
                res = Refinement.of({**res.as_dict(), **{a: INDEX for a in idx}}, res.data)
        elif name in ("add", "sub") and len(args) == 2:
            # an offset derived from axis_index(a) plus a constant built in the program
            # (`axis_index * n + arange(n)`: this device's indices) is still derived from it
            idx = set()
            for a in out.varying:
                kinds = [_r.kind(x.type, x.ref, a) for x in args]
                consts = [x.type is LITERAL or (not is_literal(v) and side.is_constant(v))
                          for x, v in zip(args, eqn.invars, strict=True)]
                if any(k is INDEX and not c for k, c in zip(kinds, consts, strict=True)) \
                        and all(k is INDEX or c for k, c in zip(kinds, consts, strict=True)):
                    idx.add(a)
            if idx:
                res = Refinement.of({**res.as_dict(), **{a: INDEX for a in idx}}, res.data)
        return res

    def _share(self, name: str, invars: Sequence[Any]) -> tuple[int, tuple[str, ...]] | None:
        return constant_share(name, [self._scalar(v) for v in invars], self.axis_sizes)

    def _scalar(self, v: Any) -> object | None:
        value = _compat.literal_value(v)
        return self.scalars.get(v) if value is None and not is_literal(v) else value

    def _call(self, eqn: Any, subs: Sequence[Any], ins: Sequence[Any], outs: Sequence[SpmdType],
              refs: Sequence[Refinement], where: Any, quiet: bool,
              pending: dict[Any, Pending], side: Side) -> list[Refinement] | None:
        sub = next((s for s in subs if len(s.invars) == len(eqn.invars)
                    and len(s.outvars) == len(eqn.outvars)), None)
        if sub is None:
            return None
        facts = [side.export(v) for v in eqn.invars]
        local = _content.localized(facts)   # the walk of `sub` reads no caller's input
        shape = self.views.shape(sub)
        key: Any = None if shape is None else (shape, tuple(refs), tuple(local), quiet)
        try:
            hit = None if key is None else self.calls.get(key)
        except TypeError:   # a fact JAX does not make hashable: no memo
            key = hit = None
        left: list[Pending]
        if hit is not None:
            res, left, self.out_facts = list(hit[0]), [], hit[1]
        else:
            reported = self.reported
            res, left = self.jaxpr(sub, refs, parent=where, quiet=quiet, facts=local)
            # (a sum of in_spec Shards made inside carries its location: walked again)
            if key is not None and not left and reported == self.reported \
                    and not _content.sums_made(self.out_facts, facts):
                self.calls[key] = (tuple(res), self.out_facts)
        for v, f in zip(eqn.outvars, _content.globalized(self.out_facts, facts), strict=False):
            side.seed(v, f)
        for p in left:
            if p.kind == "opaque":
                opaque_call_pending(eqn, ins, outs, where, pending, p)
            else:
                for v in eqn.outvars[:1]:
                    pending.setdefault(v, dataclasses.replace(p))
        return res

    def _cond(self, eqn: Any, ins: Sequence[Any], outs: Sequence[SpmdType], refs: Sequence[Refinement],
              where: Any, quiet: bool, pending: dict[Any, Pending], side: Side) -> list[Refinement]:
        pred_t = ins[0] if ins[0] is not LITERAL else SpmdType()
        diverge = pred_t.varying
        if diverge and not quiet:
            bad = sorted(a for a in diverge for o in outs if a not in o.varying)
            if bad:
                self._report(varying_predicate_error("jax.lax.cond", sorted(set(bad)), outs), where,
                            "primitive: cond")
        joined: list[Refinement] | None = None
        for br in eqn.params["branches"]:
            jp = br.jaxpr if hasattr(br, "jaxpr") else br
            res, _left = self.jaxpr(jp, refs[1:], parent=where, quiet=quiet)
            _content.blocks_out(eqn.outvars, self.out_facts, [jp], side)
            joined = res if joined is None else [_rs.join(a, b, o.varying)
                                                 for a, b, o in zip(joined, res, outs, strict=True)]
        return [diverged(r, diverge) for r in (joined or [NONE] * len(outs))]

    def _while(self, eqn: Any, ins: Sequence[Any], outs: Sequence[SpmdType], refs: Sequence[Refinement],
               where: Any, quiet: bool, pending: dict[Any, Pending], side: Side) -> list[Refinement]:
        p = eqn.params
        nc, nb = int(p["cond_nconsts"]), int(p["body_nconsts"])
        cj, bj = p["cond_jaxpr"], p["body_jaxpr"]
        cj, bj = (cj.jaxpr if hasattr(cj, "jaxpr") else cj), (bj.jaxpr if hasattr(bj, "jaxpr") else bj)
        cconsts, bconsts, carry = refs[:nc], refs[nc:nc + nb], refs[nc + nb:]
        pred_t = var_type(cj.outvars[0], self.types) if cj.outvars else SpmdType()
        diverge = pred_t.varying
        if diverge and not quiet:
            bad = sorted(a for a in diverge for o in outs if a not in o.varying)
            if bad:
                self._report(varying_predicate_error("jax.lax.while_loop", sorted(set(bad)), outs),
                            where, "primitive: while")
        carry = [diverged(r, diverge) for r in carry]
        carry = self._fixed_point(bj, list(bconsts), carry, outs, nb, where, quiet=quiet,
                                  seed=(eqn.outvars, side))
        self.jaxpr(cj, list(cconsts) + carry, parent=where, quiet=quiet)
        res, _ = self.jaxpr(bj, list(bconsts) + carry, parent=where, quiet=quiet)
        _content.blocks_out(eqn.outvars, self.out_facts, [bj], side)
        return [diverged(_rs.join(c, r, o.varying), diverge)
                for c, r, o in zip(carry, res, outs, strict=True)]

    def _scan(self, eqn: Any, outs: Sequence[SpmdType], refs: Sequence[Refinement],
              shapes: Sequence[tuple[int, ...]], where: Any, quiet: bool,
              pending: dict[Any, Pending], side: Side) -> list[Refinement]:
        p = eqn.params
        nconsts, ncarry = _compat.scan_counts(eqn)
        body = p["jaxpr"].jaxpr if hasattr(p["jaxpr"], "jaxpr") else p["jaxpr"]
        consts, carry = refs[:nconsts], refs[nconsts:nconsts + ncarry]
        xs = [drop_leading(r, len(s)) for r, s in
              zip(refs[nconsts + ncarry:], shapes[nconsts + ncarry:], strict=True)]
        carry = self._fixed_point(body, list(consts), list(carry), outs[:ncarry], 0, where,
                                  quiet=quiet, seed=(eqn.outvars, side),
                                  extra=xs)
        res, _ = self.jaxpr(body, list(consts) + carry + xs, parent=where, quiet=quiet)
        _content.blocks_out(eqn.outvars, self.out_facts, [body], side)
        return [_rs.join(c, r, o.varying) for c, r, o in zip(carry, res[:ncarry], outs[:ncarry], strict=True)] \
            + res[ncarry:]

    def _fixed_point(self, body: Any, consts: list[Refinement], carry: list[Refinement],
                     outs: Sequence[SpmdType], _nb: int, where: Any,
                     extra: Sequence[Refinement] = (), *, quiet: bool = True,
                     seed: tuple[Sequence[Any], Side] | None = None) -> list[Refinement]:
        """The loop's carries' refinements at the fixed point. The first pass is the first
        iteration, whose carries are the initial ones: walked muted (nothing reported) unless
        the loop is walked quietly, so that the diagonal blocks it makes reach the loop's
        outputs (`seed`: its outvars and side facts), as a scan over layers makes them in its
        first layer before the carry's refinement is lost to the join."""
        for i in range(16):
            if i == 0 and not quiet and seed is not None:
                muted, self.muted = self.muted, True
                try:
                    res, _ = self.jaxpr(body, consts + carry + list(extra), parent=where,
                                        quiet=False)
                finally:
                    self.muted = muted
                _content.blocks_out(seed[0], self.out_facts, [body], seed[1])
            else:
                res, _ = self.jaxpr(body, consts + carry + list(extra), parent=where, quiet=True)
            new = [_rs.join(c, r, o.varying) for c, r, o in zip(carry, res, outs, strict=False)]
            if new == carry:
                return carry
            carry = new
        return [NONE] * len(carry)

    # ------------------------------------------------------------------ excuses

    def _excuse_now(self, e: SpmdTypeError, eqn: Any, name: str, ins: Sequence[Any],
                    refs: Sequence[Refinement], side: Side) -> Refinement | None:
        """SPMD210 (a partial sum plus a replicated term) when that term is a zero (an
        accumulator's start: the sum stays Partial), was divided by the axis size (the
        pre-divided bias, F1: Partial), or is another constant built in the program (a
        regulariser such as `eps * eye`: plain). The typed program says which with an opt-out;
        the raw walk accepts them. Returns the result's refinement, or None (not excused)."""
        if e.code != "SPMD210" or name not in ("add", "add_any", "sub") or not e.axes:
            return None
        axis = e.axes[0]
        partial = True
        for v, t, r in zip(eqn.invars, ins, refs, strict=True):
            k = _r.kind(t, r, axis)
            if k is PARTIAL or side.is_zero(v):   # a zero term, of any kind, adds nothing
                continue
            if k not in (FIXED, REP):
                return None
            if axis in side.prescaled(v):
                continue
            if side.is_constant(v):
                partial = False
                continue
            return None
        kept = {a: k for a, k in (refs[0].items if refs else ()) if a != axis and isinstance(k, Shard)}
        if partial:
            kept[axis] = PARTIAL
        return Refinement.of(kept, any(r.data for r in refs))


def _not_rep_where_unsure(refs: Sequence[Refinement], invars: Sequence[Any], side: Side
                          ) -> Sequence[Refinement]:
    """A cast to Varying of a value JAX types Invariant though an input varies (`Side.unsure`:
    the permutation jax 0.10's `argsort` returns for varying keys) is not the same on every
    device: no Rep on those axes."""
    if not side.unsure:   # (the common case: no such value in the program)
        return refs
    unsure = frozenset().union(*(side.unsure.get(v, frozenset()) for v in invars
                                 if not is_literal(v)))
    if not unsure:
        return refs
    return [dataclasses.replace(r, items=tuple((a, k) for a, k in r.items
                                               if not (k is REP and a in unsure)))
            for r in refs]


# ------------------------------------------------------------------------------ entry


def check_program(eqn: Any, manual: Sequence[str], mesh: Any, report: Report, *,
                  strict: bool = False, views: Views | None = None) -> RefineWalk:
    """Walk the body of the shard_map equation `eqn` with refinements seeded from its in_specs
    (one per flat input); each violation goes to `report(e, where, extra)`. `views`: the
    equations' static facts another walk of the same program read (`eqns.Views`)."""
    inner = eqn.params["jaxpr"]
    inner = inner.jaxpr if hasattr(inner, "jaxpr") else inner
    refs = in_refinements(list(eqn.params["in_specs"]), [v.aval for v in inner.invars], manual)
    w = RefineWalk(report, _compat.mesh_axis_sizes(mesh), strict=strict,
                   in_specs=tuple(eqn.params["in_specs"]), out_specs=tuple(eqn.params["out_specs"]),
                   views=views or Views())
    w.top(inner, refs)
    return w


def check_unchecked(eqn: Any, manual: Sequence[str], mesh: Any, report: Report,
                    varying: Mapping[Any, frozenset[str]]) -> RefineWalk:
    """The refinement walk of the body of a `check_vma=False` shard_map equation `eqn`, whose
    values JAX types Invariant: each value's state is read from what the program computes
    (`varying`: `unchecked.UncheckedWalk.types`, the manual axes over which it may differ).
    The forward pass computes the same numbers with the checks on or off, so its Shard /
    Partial bugs (a bias added before the psum, attention over the local keys) are the same
    bugs; the gradients are plain (`gradients.type_gradient`): what JAX's unchecked autodiff
    leaves unsummed or partial is the unchecked walk's."""
    manual_set = frozenset(manual)
    states: dict[frozenset[str], SpmdType] = {}
    types = {v: states.get(a) or states.setdefault(a, SpmdType(varying=a & manual_set))
             for v, a in varying.items()}
    inner = eqn.params["jaxpr"]
    inner = inner.jaxpr if hasattr(inner, "jaxpr") else inner
    refs = in_refinements(list(eqn.params["in_specs"]), [v.aval for v in inner.invars], manual)
    w = RefineWalk(report, _compat.mesh_axis_sizes(mesh), in_specs=tuple(eqn.params["in_specs"]),
                   out_specs=tuple(eqn.params["out_specs"]), views=Views(types), types=types)
    w.top(inner, refs)
    return w
