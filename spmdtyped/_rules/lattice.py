"""THE join / cast lattice: which per-axis states meet, and by which casts.

One relation, read by every place that joins states:

- `FREE_CASTS`: the casts that keep a value (Invariant -> Varying, Invariant -> Reduced,
  Reduced -> Varying) and `REINTERPRETING_CASTS` (-> Unreduced: a declaration that the
  per-device values are partial sums, `st.custom_op` only);
- `join_state`: the least state both sides reach by free casts (Invariant < Reduced < Varying;
  Unreduced joins only itself) -- loop carries, cond/switch outputs, predicate widening;
- `flow_state`: the state of a result that data from several states flows into -- custom ops
  (`custom_op_type`) and `.at[]` updates (`functions.at_update_type`): like `join_state`, and
  Unreduced also absorbs Invariant and Reduced (as in U x R).

Cotangents are in `states.cotangent` (the U <-> R swap); what autodiff requires of them is here.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence

from .._errors import allowed, error
from .features import CONSERVATIVE, Features
from .states import I, R, SpmdType, State, U, V, cotangent, fmt_axes

#: (from, to) -> the `pcast(to=...)` target of the free cast that keeps the value
FREE_CASTS: dict[tuple[State, State], str] = {(I, V): "varying", (R, V): "varying",
                                              (I, R): "reduced"}
#: (from, to) -> target of the casts that reinterpret per-device values as partial sums
#: (Invariant -> Unreduced goes through Varying first)
REINTERPRETING_CASTS: dict[tuple[State, State], str] = {(V, U): "unreduced", (I, U): "unreduced"}


def join_state(s1: State, s2: State) -> State | None:
    """The least state both `s1` and `s2` reach by free casts, or None (Unreduced vs other)."""
    if s1 is s2:
        return s1
    if (s1, s2) in FREE_CASTS:
        return s2
    if (s2, s1) in FREE_CASTS:
        return s1
    return None


def flow_state(states: Iterable[State]) -> State | None:
    """The state of a result computed from values in `states` on one axis: their free-cast
    join, except that Unreduced absorbs Invariant and Reduced (a linear op of partial sums and
    replicated values); None for Unreduced next to Varying."""
    seen = set(states)
    if U in seen:
        return None if V in seen else U
    out = I
    for s in seen:
        out = join_state(out, s)  # type: ignore[assignment]
    return out


#: the wording of the two sides of a join, for messages (the mypy plugin reuses them)
BODY_LABELS = ("before the body", "after the body")
PREDICATE_WHERE = {"predicate": "in the branches", "condition": "in the loop",
                   "trip count": "in the loop"}


def branch_labels(seen: Sequence[int], k: int) -> tuple[str, str]:
    """Labels for joining branch `k`'s output with the branches `seen` before it."""
    return (f"in branch {', '.join(str(i) for i in seen) or '0'}", f"in branch {k}")


def predicate_labels(what: str, varying: Iterable[str]) -> tuple[str, str]:
    """Labels for widening under a `what` ("predicate", "condition", "trip count") that is
    Varying over `varying`."""
    return (PREDICATE_WHERE[what], f"under a {what} Varying over {sorted(varying)}")


def join_carry(before: SpmdType, after: SpmdType, *, op: str = "st.fori_loop",
               what: str = "carry", labels: tuple[str, str] = BODY_LABELS) -> SpmdType:
    """The state a loop carry (or a cond/switch output) must have so that both `before` and
    `after` reach it by a free cast that keeps the value (`join_state` per axis).

    **Raises:** `CastError` SPMD302 when one side is Unreduced and the other is not (or the
    pending reductions differ): no cast into or out of Unreduced keeps the value.
    """
    if before == after:
        return before
    out: dict[State, set[str]] = {V: set(), U: set(), R: set(), I: set()}
    for a in sorted(before.axes | after.axes):
        s1, s2 = before.state(a), after.state(a)
        s = join_state(s1, s2)
        if s is U and before.kind != after.kind:
            s = None
        if s is None:
            if s1 is U and s2 is U:
                fix = "use the same reduction on both sides"
            else:
                fix = (f"keep it Unreduced and reduce after: st.psum(result, {a!r}); an Unreduced "
                       f"accumulator starts from st.pcast(st.pvary(zeros, {a!r}), {a!r}, "
                       f"to='unreduced')")
            raise error("SPMD302", f"{op}: {what} is {s1.title} over {a!r} {labels[0]} but "
                        f"{s2.title} {labels[1]}; no free cast joins {s1.title} and {s2.title}",
                        axes=(a,), states={a: f"{s1.value} {labels[0]}, {s2.value} {labels[1]}"},
                        op=op, fix=fix, details=(f"{labels[0]}: {before}", f"{labels[1]}: {after}"))
        out[s].add(a)
    kind = (before.unreduced_kind or after.unreduced_kind) if out[U] else None
    return SpmdType(out[V], out[U], out[R], kind)


def predicate_type(t: SpmdType) -> SpmdType:
    """What a loop condition / branch predicate / trip count of type `t` imposes on the carries
    and outputs: Varying wherever it varies (devices may take different paths)."""
    return SpmdType(varying=t.varying)


def widen_under_predicate(t: SpmdType, pred: SpmdType, *, op: str, what: str,
                          path: str) -> SpmdType:
    """`t` made Varying where a `what` ("predicate", "condition", "trip count") of type `pred`
    varies: devices may take different paths (JAX types such results Invariant).

    **Raises:** `CastError` SPMD302 for an Unreduced `t` there: no cast keeps partial sums
    meaningful when devices take different paths.
    """
    req = predicate_type(pred).varying
    if not req:
        return t
    return join_carry(t, t.with_states(req, V), op=op, what=path,
                      labels=predicate_labels(what, req))


def free_casts(frm: SpmdType, to: SpmdType, *, reinterpret: bool = False
               ) -> list[tuple[str, tuple[str, ...]]] | None:
    """The `pcast` steps `[(to, axes), ...]` taking state `frm` to `to`, or None if none exists.

    Without `reinterpret` only `FREE_CASTS`; with it also `REINTERPRETING_CASTS` (a declaration
    says the per-device values are partial sums: `st.custom_op`).
    """
    steps: dict[tuple[State, State], list[str]] = {k: [] for k in FREE_CASTS}
    to_u: list[str] = []
    for a in sorted(frm.axes | to.axes):
        s1, s2 = frm.state(a), to.state(a)
        if s1 is s2:
            if s1 is U and frm.kind != to.kind:
                return None
            continue
        if (s1, s2) in FREE_CASTS:
            steps[(s1, s2)].append(a)
        elif reinterpret and (s1, s2) in REINTERPRETING_CASTS and to.kind == "sum":
            if s1 is I:
                steps[(I, V)].append(a)
            to_u.append(a)
        else:
            return None
    order = [(FREE_CASTS[(I, V)], steps[(I, V)]), (FREE_CASTS[(R, V)], steps[(R, V)]),
             (FREE_CASTS[(I, R)], steps[(I, R)]), (REINTERPRETING_CASTS[(V, U)], to_u)]
    return [(target, tuple(axes)) for target, axes in order if axes]


# ------------------------------------------------------------------------- custom ops

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
                        fix=f"reduce first (st.psum(x, {fmt_axes(bad_u)})), or declare "
                            f"requires={{{bad_u[0]!r}: 'unreduced'}} if the op is linear")
    out: dict[State, set[str]] = {V: set(), U: set(), R: set(), I: set()}
    kind = None
    for a in sorted(frozenset().union(*(t.axes for t in in_types)) if in_types else ()):
        seen = {t.state(a) for t in in_types}
        joined = flow_state(seen)
        if joined is None:
            k = next(k for k, t in enumerate(in_types) if t.state(a) is V)
            raise error("SPMD201", f"{op}: one argument is Unreduced over {a!r} and "
                        f"{names[k]} is Varying there", axes=(a,), states={a: "varying"},
                        op=op, fix=f"st.psum(x, {a!r}) first")
        s = joined
        if s is U:
            kind = kind or next(t.kind for t in in_types if t.state(a) is U)
        out[s].add(a)
    result = SpmdType(out[V], out[U], out[R], kind)
    if produces:
        for a, s in produces.items():
            result = result.with_states((a,), s)
        if result.unreduced and result.unreduced_kind is None:
            result = result.replace(unreduced_kind="sum")
    return result


# ------------------------------------------------------------------------- cotangents

def grad_loss_type(t: SpmdType, features: Features = CONSERVATIVE, *,
                   op: str = "st.grad") -> SpmdType:
    """The cotangent `grad` seeds for a loss of type `t`: Invariant or Varying like the loss
    (on jax 0.12.1, `Feature.REDUCED_LOSS_GRAD`, a Reduced loss too: its seed is Unreduced).

    **Raises:** `BoundaryError` SPMD405 for an Unreduced loss, or a Reduced one where JAX
    cannot seed it (a seed of ones in the swapped state would not be the derivative of the
    loss).
    """
    bad = sorted(t.unreduced if features.reduced_loss_grad else t.unreduced | t.reduced)
    if bad:
        a = bad[0]
        s = t.state(a)
        fix = (f"st.psum(loss, {fmt_axes(sorted(t.unreduced))}) inside the function"
               if t.unreduced else f"st.pcast(loss, {fmt_axes(sorted(t.reduced))}, "
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


def check_vmap_grad(loss: SpmdType, params: Sequence[tuple[str, SpmdType]], *,
                    op: str = "st.grad") -> None:
    """SPMD407: `grad` traced under `vmap` of a per-example loss Varying over some axes, with
    respect to a parameter Invariant there. JAX transposes the implicit pvary of the parameter
    to a psum, so every per-example gradient comes out summed over the devices (jax#36886).

    `params`: `(name, state)` of each differentiated leaf. Strict (`st.allow("SPMD407")`): the
    sum of the per-example gradients over the batch is right (the total gradient).
    """
    if allowed("SPMD407"):
        return
    for name, t in params:
        bad = sorted(a for a in loss.varying if a not in t.axes)
        if not bad:
            continue
        axes = fmt_axes(bad)
        raise error("SPMD407", f"{op} under jax.vmap: the per-example loss is Varying over {axes} "
                    f"and {name} is Invariant there: JAX sums each per-example gradient of {name} "
                    f"over the devices", axes=bad, states={a: "invariant" for a in bad}, op=op,
                    details=(f"loss: {loss}", f"{name}: {t}"),
                    fix=f"params = st.pcast(params, {axes}, to='varying') before jax.vmap (a "
                        f"per-device copy: no sum over devices); or st.allow('SPMD407') if only "
                        f"the sum over the batch is used")
