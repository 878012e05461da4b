"""Typed control flow: `st.fori_loop`, `st.scan`, `st.while_loop`, `st.cond`, `st.switch`.

jax.lax's signatures. Bodies and branches receive typed values and may return typed or raw
ones. Carries keep their types: when the body returns a carry more varying than it came in
(the most common JAX complaint, "carry input and carry output must have equal types"), the
initial carry is cast for free (`_rules.join_carry`: Invariant -> Varying / Reduced, Reduced
-> Varying) and the body retraced, until a fixed point; outputs less varying than the carry are
cast on the way out. Branch outputs of cond/switch are joined the same way. A loop condition,
trip count or branch predicate that varies makes every carry/output Varying on its axes
(devices may take different paths; JAX types such results Invariant). A state change no free
cast fixes raises `CastError` SPMD302 naming the carry by its pytree path.

A cond/switch predicate that varies over some axes casts the Invariant (and Reduced) operands
to Varying there *before* the branch is bound: under grad, the transpose of that cast (a psum
of the operands' cotangents) then runs outside the divergent branches, where every device
takes part. Widening only the outputs, inside the branches, puts the psum inside them and
gives a wrong gradient (jax#40823: 16 instead of 23 on 8 devices). The forward values are
the same. Values the branches close over are not operands and are not cast: pass them as
operands. Loop carries are cast before the loop already (the initial carry).

Refinements (Shard / Partial / Rep) follow the same joins: a carry or output keeps one where
every iteration or branch agrees (`refine_shape.join`), and on the axes of a varying
predicate or trip count only a Shard (a layout) survives.

The first trace runs inside the real `jax.lax` call; only when a carry must widen is that
trace abandoned (a private exception) and the loop traced again, so a body whose carries are
stable is traced exactly as often as with jax.lax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from .. import _compat, _rules, _validate
from .._errors import error
from .._rules import SpmdType
from .._rules.refine import NONE as _NO_REFINEMENT
from .._rules.refine import REP, Refinement, Shard
from .._rules.refine import shape as _refine
from .._typed.array import checked, is_typed, refinement_of, typeof, unwrap
from . import collectives as _collectives

_MAX_RETRACES = 16  # each retrace widens at least one axis of one carry: bounded by the lattice


class _Widen(Exception):
    """Abandon the current trace: the carry/output types must widen to `types` (and the
    refinements to `refs`: a loop carry keeps a Shard/Partial/Rep only where every iteration
    agrees, `refine_shape.join`)."""

    def __init__(self, types: list[SpmdType], refs: list[Refinement] | None = None) -> None:
        super().__init__("spmdtyped internal: carry types widen")
        self.types = types
        self.refs = refs


class _Tree:
    """A flattened pytree of typed/raw leaves, with pytree paths for messages."""

    def __init__(self, tree: Any, name: str) -> None:
        with_path, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_typed)
        self.treedef: Any = treedef
        self.paths = [name + jax.tree_util.keystr(p) for p, _ in with_path]
        self.leaves = [leaf for _, leaf in with_path]
        self.types = [typeof(leaf) for leaf in self.leaves]
        self.refs = [refinement_of(leaf) for leaf in self.leaves]

    def raw(self, leaves: Sequence[Any] | None = None) -> list[Any]:
        return [unwrap(x) for x in (self.leaves if leaves is None else leaves)]

    def typed(self, raws: Sequence[Any], types: Sequence[SpmdType], op: str,
              refs: Sequence[Refinement] | None = None) -> Any:
        refs = refs if refs is not None else [_NO_REFINEMENT] * len(types)
        return self.treedef.unflatten([checked(op, r, t, f.restrict(t.varying))
                                       for r, t, f in zip(raws, types, refs, strict=True)])


def _uniform_dropped(ref: Refinement, axes: frozenset[str]) -> Refinement:
    """`ref` after a divergent path over `axes` (devices may have run different branches or
    iteration counts): only a Shard (a layout) survives there; Rep, Partial, Index no longer
    hold."""
    if not axes:
        return ref
    return Refinement.of({a: k for a, k in ref.items if a not in axes or isinstance(k, Shard)},
                         ref.data)


def _join_refs(cur: Sequence[Refinement], got: Sequence[Refinement], types: Sequence[SpmdType],
               diverge: frozenset[str]) -> list[Refinement]:
    return [_uniform_dropped(_refine.join(c, g, t.varying), diverge)
            for c, g, t in zip(cur, got, types, strict=True)]


def _cast(leaf: Any, frm: SpmdType, to: SpmdType) -> Any:
    """`leaf` (typed or raw) brought from state `frm` to `to` by free casts; returns raw."""
    if frm == to:
        return unwrap(leaf)
    steps = _rules.free_casts(frm, to)
    assert steps is not None, (frm, to)  # join_carry only produces reachable states
    for target, axes in steps:
        leaf = _collectives.pcast(leaf, axes if len(axes) > 1 else axes[0], to=target)
    return unwrap(leaf)


def _pred_req(*preds: Any) -> SpmdType:
    """The state a condition/predicate/trip count imposes: Varying where any of them varies."""
    varying: frozenset[str] = frozenset()
    for p in preds:
        if p is not None:
            varying |= _rules.predicate_type(typeof(p)).varying
    return SpmdType(varying=varying)


def _pred_join(ts: Sequence[SpmdType], paths: Sequence[str], req: SpmdType, op: str,
               what: str) -> list[SpmdType]:
    """Each type widened under a `what` of state `req` (`_rules.widen_under_predicate`)."""
    return [_rules.widen_under_predicate(t, req, op=op, what=what, path=path)
            for t, path in zip(ts, paths, strict=True)]


def _fit_outputs(out: Any, tree: _Tree, types: list[SpmdType], op: str,
                 labels: tuple[str, str], refs: list[Refinement] | None = None,
                 diverge: frozenset[str] = frozenset()) -> list[Any]:
    """The body's outputs cast to `types`; raises _Widen if `types` (or the carries'
    refinements `refs`) must widen first."""
    leaves, treedef = jax.tree_util.tree_flatten(out, is_leaf=is_typed)
    if treedef != tree.treedef:  # type: ignore[operator]
        # not a state problem: return as is and let JAX report the structure mismatch
        return [unwrap(x) for x in leaves]
    got = [typeof(x) for x in leaves]
    joined = [_rules.join_carry(t, g, op=op, what=path, labels=labels)
              for t, g, path in zip(types, got, tree.paths, strict=True)]
    new_refs = None
    if refs is not None:
        new_refs = _join_refs(refs, [refinement_of(x) for x in leaves], joined, diverge)
    if joined != types or (refs is not None and new_refs != refs):
        raise _Widen(joined, new_refs)
    return [_cast(x, g, t) for x, g, t in zip(leaves, got, types, strict=True)]


def _retrying(run: Callable[[list[SpmdType], list[Refinement]], Any], types: list[SpmdType],
              init_refs: Callable[[list[SpmdType]], list[Refinement]]
              ) -> tuple[Any, list[SpmdType], list[Refinement]]:
    """Run `run(types, refs)` until no carry widens; refinements only ever shrink (join)."""
    refs = init_refs(types)
    for _ in range(_MAX_RETRACES):
        try:
            return run(types, refs), types, refs
        except _Widen as w:
            prev = w.refs if w.refs is not None else refs
            refs = [_refine.join(b, p, t.varying)
                    for b, p, t in zip(init_refs(w.types), prev, w.types, strict=True)]
            types = w.types
    raise RuntimeError("spmdtyped: loop carry types did not reach a fixed point")  # pragma: no cover


def _init_refs(tree: _Tree, types: list[SpmdType],
               diverge: frozenset[str] = frozenset()) -> list[Refinement]:
    """The carries' initial refinements: the init values', with Rep where the init is cast
    to Varying (a pvary of an equal value); under a varying trip count or condition over
    `diverge`, only Shards survive there."""
    out = []
    for r, t0, t in zip(tree.refs, tree.types, types, strict=True):
        # a cast value carrying data is Rep; a constant (zeros: an accumulator's start, which
        # is every kind of sum at once) stays plain, so that `acc + partial` is no error
        cast = t.varying - t0.varying if r.data else frozenset()
        ref = Refinement.of({**r.as_dict(), **{a: REP for a in cast}}, r.data).restrict(t.varying)
        out.append(_uniform_dropped(ref, diverge))
    return out


def _cast_init(tree: _Tree, types: list[SpmdType]) -> list[Any]:
    return [_cast(x, t0, t) for x, t0, t in zip(tree.leaves, tree.types, types, strict=True)]


# ------------------------------------------------------------------------------------ loops


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init_val: Any, *,
              unroll: int | bool | None = None) -> Any:
    """Typed `jax.lax.fori_loop`: `body_fun(i, carry) -> carry` on typed values.

    An initial carry less varying than what the body returns is cast for free (`pvary`, or
    Invariant -> Reduced, Reduced -> Varying) and the body retraced; a body output less varying
    than its carry is cast on the way out. Trip-count bounds that vary make every carry Varying
    on their axes.

    **Arguments:** as `jax.lax.fori_loop`; `init_val` is a pytree of typed or raw values, `i` is
    passed to the body as a typed int32 scalar.

    **Returns:** the final carry, typed, with the joined states.

    **Raises:** `CastError` SPMD302 when a carry changes state in a way no free cast fixes
    (e.g. the body reduces an Unreduced carry); the message names the carry by pytree path.

    !!! Example
        ```python
        def body(i, acc):                      # acc arrives Varying["sp"] after the auto-cast
            return acc + x * i
        acc = st.fori_loop(0, 4, body, jnp.zeros(8))   # zeros: Invariant -> pvary'd
        ```
    """
    _validate.callable_arg(body_fun, "st.fori_loop", "body_fun")
    _validate.int_arg(lower, "st.fori_loop", "lower")
    _validate.int_arg(upper, "st.fori_loop", "upper")
    op = "st.fori_loop"
    tree = _Tree(init_val, "init_val")
    req = _pred_req(lower, upper)
    types = _pred_join(tree.types, tree.paths, req, op, "trip count")
    lo, hi = unwrap(lower), unwrap(upper)

    def run(types: list[SpmdType], refs: list[Refinement]) -> Any:
        def raw_body(i: Any, raw_carry: Any) -> Any:
            out = body_fun(checked(op, i, typeof(i)), tree.typed(raw_carry, types, op, refs))
            return _fit_outputs(out, tree, types, op, _rules.BODY_LABELS, refs, req.varying)

        kw = {} if unroll is None else {"unroll": unroll}
        with _validate.jax_arguments("st.fori_loop"):  # a carry whose shape changes
            return jax.lax.fori_loop(lo, hi, raw_body, _cast_init(tree, types), **kw)

    raw, types, refs = _retrying(run, types, lambda ts: _init_refs(tree, ts, req.varying))
    return tree.typed(raw, types, op, refs)


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any) -> Any:
    """Typed `jax.lax.while_loop`: `cond_fun(carry) -> bool`, `body_fun(carry) -> carry`.

    Carries are joined as in `fori_loop`. A condition that varies over some axes (devices may
    run different numbers of iterations) makes every carry Varying there; JAX itself types the
    result Invariant, which is unsound.

    **Arguments:** as `jax.lax.while_loop`, on typed or raw values.

    **Returns:** the final carry, typed.

    **Raises:** `CastError` SPMD302 for a carry no free cast can join (e.g. Unreduced under a
    varying condition).

    !!! Example
        ```python
        n = st.while_loop(lambda c: c < limit, lambda c: c + 1, 0)   # limit: Varying["dp"]
        ```
    """
    _validate.callable_arg(cond_fun, "st.while_loop", "cond_fun")
    _validate.callable_arg(body_fun, "st.while_loop", "body_fun")
    op = "st.while_loop"
    tree = _Tree(init_val, "init_val")

    diverge: set[str] = set()

    def run(types: list[SpmdType], refs: list[Refinement]) -> Any:
        def raw_cond(raw_carry: Any) -> Any:
            pred = cond_fun(tree.typed(raw_carry, types, op, refs))
            req = _pred_req(pred)
            widened = _pred_join(types, tree.paths, req, op, "condition")
            if widened != types or not req.varying <= diverge:
                diverge.update(req.varying)
                raise _Widen(widened)
            return unwrap(pred)

        def raw_body(raw_carry: Any) -> Any:
            out = body_fun(tree.typed(raw_carry, types, op, refs))
            return _fit_outputs(out, tree, types, op, _rules.BODY_LABELS, refs,
                                frozenset(diverge))

        with _validate.jax_arguments("st.while_loop"):
            return jax.lax.while_loop(raw_cond, raw_body, _cast_init(tree, types))

    raw, types, refs = _retrying(run, list(tree.types),
                                 lambda ts: _init_refs(tree, ts, frozenset(diverge)))
    return tree.typed(raw, types, op, refs)


def scan(f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any = None,
         length: int | None = None, reverse: bool = False, unroll: int | bool = 1,
         _split_transpose: bool = False) -> tuple[Any, Any]:
    """Typed `jax.lax.scan`: `f(carry, x) -> (carry, y)`.

    Carries are joined as in `fori_loop`; the slices `x` keep the states of `xs`; the stacked
    `ys` keep the states the body gives each `y`.

    **Arguments:** as `jax.lax.scan`; `init` and `xs` are pytrees of typed or raw values.

    **Returns:** `(carry, ys)`, typed.

    **Raises:** `CastError` SPMD302 for a carry no free cast can join.

    !!! Example
        ```python
        def step(h, x):                        # h: Varying["dp"], x: Varying["dp"]
            h = st.numpy.tanh(h @ w + x)
            return h, h
        h, hs = st.scan(step, jnp.zeros(16), xs)
        ```
    """
    _validate.callable_arg(f, "st.scan", "f")
    op = "st.scan"
    tree = _Tree(init, "init")
    xtree = _Tree(xs, "xs")
    y_info: dict[str, Any] = {}

    # a slice of xs drops the scanned (leading) dim: a Shard on it is lost, the others keep
    # their dims (counted from the right)
    x_refs = [Refinement.of({a: k for a, k in r.items
                             if not (isinstance(k, Shard) and k.dim == -len(getattr(leaf, "shape", ())))},
                            r.data) for r, leaf in zip(xtree.refs, xtree.leaves, strict=True)]

    def run(types: list[SpmdType], refs: list[Refinement]) -> Any:
        def raw_f(raw_carry: Any, raw_x: Any) -> Any:
            x = xtree.typed(raw_x, xtree.types, op, x_refs) if xtree.leaves \
                else xtree.treedef.unflatten([])
            out = f(tree.typed(raw_carry, types, op, refs), x)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(f"{op}: the body must return a pair (carry, y), got "
                                f"{type(out).__name__}")
            carry, y = out
            raw_c = _fit_outputs(carry, tree, types, op, _rules.BODY_LABELS, refs)
            y_leaves, y_def = jax.tree_util.tree_flatten(y, is_leaf=is_typed)
            y_info["types"], y_info["treedef"] = [typeof(v) for v in y_leaves], y_def
            # stacking adds a leading dim: dims counted from the right are unchanged
            y_info["refs"] = [refinement_of(v) for v in y_leaves]
            return raw_c, [unwrap(v) for v in y_leaves]

        return jax.lax.scan(raw_f, _cast_init(tree, types), xtree.raw() or None, length=length,
                            reverse=reverse, unroll=unroll, _split_transpose=_split_transpose)

    (raw_carry, raw_ys), types, refs = _retrying(run, list(tree.types),
                                                 lambda ts: _init_refs(tree, ts))
    y_def: Any = y_info["treedef"]
    ys = y_def.unflatten([checked(op, r, t, f) for r, t, f in
                          zip(raw_ys, y_info["types"], y_info["refs"], strict=True)])
    return tree.typed(raw_carry, types, op, refs), ys


# --------------------------------------------------------------------------------- branches


def _vary_operands(optree: _Tree, axes: frozenset[str], op: str) -> tuple[list[Any], list[SpmdType],
                                                                         list[Refinement]]:
    """The operands cast to Varying over `axes` (Invariant -> Varying, Reduced -> Varying: free
    casts) *before* a branch on a predicate varying there is bound. Their backward then
    reduces (the transpose of the cast) outside the divergent branches, where every device
    takes part (jax#40823), instead of inside them. Returns (typed leaves, states, refs)."""
    leaves, types, refs = [], [], []
    for leaf, t, r in zip(optree.leaves, optree.types, optree.refs, strict=True):
        widen = sorted(a for a in axes if t.state(a) in (_rules.I, _rules.R))
        target = t.with_states(widen, _rules.V) if widen else t
        ref = Refinement.of({**r.as_dict(), **{a: REP for a in widen if r.data}}, r.data)
        if widen and not isinstance(leaf, (int, float, complex, bool)):
            raw = _cast(leaf, t, target)
            leaf = checked(op, raw, target, ref.restrict(target.varying))
            t = target
        leaves.append(leaf)
        types.append(t)
        refs.append(ref.restrict(t.varying))
    return leaves, types, refs


def _check_closures(op: str, fns: Sequence[Callable[..., Any]], optree: _Tree,
                    axes: frozenset[str]) -> None:
    """SPMD303 for a branch that closes over a differentiated value replicated over the
    predicate's axes: not an operand, it is not cast, and its gradient would be reduced inside
    the divergent branches (jax#40823). `jax.closure_convert` hoists the closed-over values
    that may be differentiated; those a grad/vjp traces here (`_compat.is_differentiated`) are
    reported. Forward values are right, so a program only staged by jit is accepted (a grad
    taken outside that jit is not visible here: pass such values as operands)."""
    ops = optree.treedef.unflatten(optree.leaves) if optree.leaves else ()
    for k, fn in enumerate(fns):
        try:
            _conv, consts = jax.closure_convert(fn, *ops)
        except Exception:  # noqa: BLE001 - a branch closure_convert cannot trace: JAX will say
            continue
        for c in consts:
            if not _compat.is_differentiated(c):
                continue
            t = typeof(c)
            bad = sorted(a for a in axes if t.state(a) in (_rules.I, _rules.R))
            if bad and jax.numpy.issubdtype(getattr(c, "dtype", None) or float, jax.numpy.inexact):
                a = bad[0]
                raise error("SPMD303", f"{op}: branch {k} closes over a differentiated value "
                            f"{t.state(a).title} over {a!r} ({c.dtype}{list(c.shape)}) while the "
                            f"predicate varies over {a!r}: its gradient would be reduced inside "
                            f"the divergent branches (jax#40823)", axes=tuple(bad),
                            states={x: "closed over, not varying" for x in bad}, op=op,
                            fix=f"pass it as an operand: {op}(pred, lambda x: ..., lambda x: ..., "
                                f"x) ({op} casts operands to varying over {a!r})")


def _branches(op: str, pred: Any, fns: Sequence[Callable[..., Any]], operands: tuple[Any, ...],
              bind: Callable[[Any, list[Callable[..., Any]], list[Any]], Any]) -> Any:
    req = _pred_req(pred)
    diverge = frozenset(req.varying)
    optree = _Tree(operands, "operands")
    if diverge and optree.leaves:
        optree.leaves, optree.types, optree.refs = _vary_operands(optree, diverge, op)
    if diverge:
        _check_closures(op, fns, optree, diverge)
    info: dict[str, Any] = {}

    def run(preset: list[SpmdType] | None) -> Any:
        cur: dict[str, Any] = {"target": preset, "seen": [], "refs": None}

        def make(k: int, fn: Callable[..., Any]) -> Callable[..., Any]:
            def raw_branch(*raw_ops: Any) -> Any:
                ops = optree.typed(jax.tree_util.tree_leaves(raw_ops), optree.types, op,
                                   optree.refs) if optree.leaves else operands
                out = fn(*ops)
                with_path, tdef_ = jax.tree_util.tree_flatten_with_path(out, is_leaf=is_typed)
                tdef: Any = tdef_
                leaves = [x for _, x in with_path]
                paths = ["output" + jax.tree_util.keystr(p) for p, _ in with_path]
                got = [typeof(x) for x in leaves]
                got_refs = [refinement_of(x) for x in leaves]
                if info.get("treedef", tdef) != tdef:
                    return out if not leaves else jax.tree_util.tree_map(unwrap, out, is_leaf=is_typed)
                info["treedef"] = tdef
                target = cur["target"]
                if target is None:
                    target = [_pred_join([g], [p], req, op, "predicate")[0] if req.varying else g
                              for g, p in zip(got, paths, strict=True)]
                    cur["target"] = target
                else:
                    labels = _rules.branch_labels(cur["seen"], k)
                    joined = [_rules.join_carry(t, g, op=op, what=p, labels=labels)
                              for t, g, p in zip(target, got, paths, strict=True)]
                    if joined != target:
                        raise _Widen(joined)
                # outputs: the join of every branch's refinement (plain where they disagree;
                # only Shards survive on the predicate's axes)
                cur["refs"] = got_refs if cur["refs"] is None else \
                    [_refine.join(a, b, t.varying) for a, b, t in zip(cur["refs"], got_refs, target,
                                                                       strict=True)]
                cur["seen"].append(k)
                return tdef.unflatten([_cast(x, g, t) for x, g, t in zip(leaves, got, target, strict=True)])

            return raw_branch

        out = bind(unwrap(pred), [make(k, fn) for k, fn in enumerate(fns)], optree.raw())
        info["types"] = cur["target"]
        info["refs"] = [_uniform_dropped(r, diverge).restrict(t.varying)
                        for r, t in zip(cur["refs"] or [], cur["target"] or [], strict=True)]
        return out

    preset: list[SpmdType] | None = None
    for _ in range(_MAX_RETRACES):
        try:
            raw_out = run(preset)
            break
        except _Widen as w:
            preset = w.types
    else:  # pragma: no cover
        raise RuntimeError("spmdtyped: branch output types did not reach a fixed point")
    leaves = jax.tree_util.tree_leaves(raw_out)
    refs = info["refs"] or [_NO_REFINEMENT] * len(leaves)
    return info["treedef"].unflatten([checked(op, r, t, f) for r, t, f in
                                      zip(leaves, info["types"], refs, strict=True)])


_MISSING = object()


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any,
         operand: Any = _MISSING) -> Any:
    """Typed `jax.lax.cond`: branches on typed values, outputs joined by free casts.

    Each output takes the join of its states in both branches (e.g. Invariant in one branch and
    Varying in the other gives Varying: the Invariant branch's value is `pvary`'d). A predicate
    that varies makes every output Varying on its axes (JAX types such outputs Invariant), and
    casts the operands to Varying on those axes before the branch, so that the gradient of an
    Invariant operand is reduced outside the divergent branches (jax#40823).

    **Arguments:** as `jax.lax.cond`: `pred` a typed or raw boolean scalar, `*operands` typed or
    raw pytrees passed to the branch taken.

    **Returns:** the branch's outputs, typed.

    **Raises:** `CastError` SPMD302 when an output is Unreduced in one branch and not in the
    other (or Unreduced under a varying predicate).

    !!! Example
        ```python
        y = st.cond(step == 0, lambda x: x, lambda x: st.psum(x, "dp") / 8, x)
        ```
    """
    _validate.pred_arg(pred, "st.cond")
    _validate.callable_arg(true_fun, "st.cond", "true_fun")
    _validate.callable_arg(false_fun, "st.cond", "false_fun")
    if operand is not _MISSING:
        operands = (*operands, operand)
    return _branches("st.cond", pred, [true_fun, false_fun], operands,
                     lambda p, fns, raw_ops: jax.lax.cond(
                         p, fns[0], fns[1], *jax.tree_util.tree_unflatten(
                             jax.tree_util.tree_structure(operands, is_leaf=is_typed), raw_ops)))


def switch(index: Any, branches: Sequence[Callable[..., Any]], *operands: Any,
           operand: Any = _MISSING) -> Any:
    """Typed `jax.lax.switch`: `branches[index](*operands)`, outputs joined like `cond`.

    **Arguments:** as `jax.lax.switch`; `index` a typed or raw int32 scalar (clamped by JAX).

    **Returns:** the outputs of the branch taken, typed with the join of all branches' states.

    **Raises:** `CastError` SPMD302 when no free cast joins an output's states.

    !!! Example
        ```python
        y = st.switch(k, [lambda x: x, lambda x: 2.0 * x, st.numpy.tanh], x)
        ```
    """
    _validate.branches_arg(branches, "st.switch")
    _validate.int_arg(index, "st.switch", "index")
    if operand is not _MISSING:
        operands = (*operands, operand)
    return _branches("st.switch", index, list(branches), operands,
                     lambda p, fns, raw_ops: jax.lax.switch(
                         p, fns, *jax.tree_util.tree_unflatten(
                             jax.tree_util.tree_structure(operands, is_leaf=is_typed), raw_ops)))


__all__ = ["cond", "fori_loop", "scan", "switch", "while_loop"]
