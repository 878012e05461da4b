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

The first trace runs inside the real `jax.lax` call; only when a carry must widen is that
trace abandoned (a private exception) and the loop traced again, so a body whose carries are
stable is traced exactly as often as with jax.lax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from . import _collectives, _rules
from ._array import checked, is_typed, typeof, unwrap
from ._rules import SpmdType

_MAX_RETRACES = 16  # each retrace widens at least one axis of one carry: bounded by the lattice


class _Widen(Exception):
    """Abandon the current trace: the carry/output types must widen to `types`."""

    def __init__(self, types: list[SpmdType]) -> None:
        super().__init__("spmdtyped internal: carry types widen")
        self.types = types


class _Tree:
    """A flattened pytree of typed/raw leaves, with pytree paths for messages."""

    def __init__(self, tree: Any, name: str) -> None:
        with_path, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_typed)
        self.treedef: Any = treedef
        self.paths = [name + jax.tree_util.keystr(p) for p, _ in with_path]
        self.leaves = [leaf for _, leaf in with_path]
        self.types = [typeof(leaf) for leaf in self.leaves]

    def raw(self, leaves: Sequence[Any] | None = None) -> list[Any]:
        return [unwrap(x) for x in (self.leaves if leaves is None else leaves)]

    def typed(self, raws: Sequence[Any], types: Sequence[SpmdType], op: str) -> Any:
        return self.treedef.unflatten([checked(op, r, t) for r, t in zip(raws, types, strict=True)])


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
                 labels: tuple[str, str]) -> list[Any]:
    """The body's outputs cast to `types`; raises _Widen if `types` must widen first."""
    leaves, treedef = jax.tree_util.tree_flatten(out, is_leaf=is_typed)
    if treedef != tree.treedef:  # type: ignore[operator]
        # not a state problem: return as is and let JAX report the structure mismatch
        return [unwrap(x) for x in leaves]
    got = [typeof(x) for x in leaves]
    joined = [_rules.join_carry(t, g, op=op, what=path, labels=labels)
              for t, g, path in zip(types, got, tree.paths, strict=True)]
    if joined != types:
        raise _Widen(joined)
    return [_cast(x, g, t) for x, g, t in zip(leaves, got, types, strict=True)]


def _retrying(run: Callable[[list[SpmdType]], Any], types: list[SpmdType]) -> tuple[Any, list[SpmdType]]:
    for _ in range(_MAX_RETRACES):
        try:
            return run(types), types
        except _Widen as w:
            types = w.types
    raise RuntimeError("spmdtyped: loop carry types did not reach a fixed point")  # pragma: no cover


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
    op = "st.fori_loop"
    tree = _Tree(init_val, "init_val")
    req = _pred_req(lower, upper)
    types = _pred_join(tree.types, tree.paths, req, op, "trip count")
    lo, hi = unwrap(lower), unwrap(upper)

    def run(types: list[SpmdType]) -> Any:
        def raw_body(i: Any, raw_carry: Any) -> Any:
            out = body_fun(checked(op, i, typeof(i)), tree.typed(raw_carry, types, op))
            return _fit_outputs(out, tree, types, op, _rules.BODY_LABELS)

        kw = {} if unroll is None else {"unroll": unroll}
        return jax.lax.fori_loop(lo, hi, raw_body, _cast_init(tree, types), **kw)

    raw, types = _retrying(run, types)
    return tree.typed(raw, types, op)


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
    op = "st.while_loop"
    tree = _Tree(init_val, "init_val")

    def run(types: list[SpmdType]) -> Any:
        def raw_cond(raw_carry: Any) -> Any:
            pred = cond_fun(tree.typed(raw_carry, types, op))
            req = _pred_req(pred)
            widened = _pred_join(types, tree.paths, req, op, "condition")
            if widened != types:
                raise _Widen(widened)
            return unwrap(pred)

        def raw_body(raw_carry: Any) -> Any:
            out = body_fun(tree.typed(raw_carry, types, op))
            return _fit_outputs(out, tree, types, op, _rules.BODY_LABELS)

        return jax.lax.while_loop(raw_cond, raw_body, _cast_init(tree, types))

    raw, types = _retrying(run, list(tree.types))
    return tree.typed(raw, types, op)


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
    op = "st.scan"
    tree = _Tree(init, "init")
    xtree = _Tree(xs, "xs")
    y_info: dict[str, Any] = {}

    def run(types: list[SpmdType]) -> Any:
        def raw_f(raw_carry: Any, raw_x: Any) -> Any:
            x = xtree.typed(raw_x, xtree.types, op) if xtree.leaves else xtree.treedef.unflatten([])
            out = f(tree.typed(raw_carry, types, op), x)
            if not (isinstance(out, tuple) and len(out) == 2):
                raise TypeError(f"{op}: the body must return a pair (carry, y), got "
                                f"{type(out).__name__}")
            carry, y = out
            raw_c = _fit_outputs(carry, tree, types, op, _rules.BODY_LABELS)
            y_leaves, y_def = jax.tree_util.tree_flatten(y, is_leaf=is_typed)
            y_info["types"], y_info["treedef"] = [typeof(v) for v in y_leaves], y_def
            return raw_c, [unwrap(v) for v in y_leaves]

        return jax.lax.scan(raw_f, _cast_init(tree, types), xtree.raw() or None, length=length,
                            reverse=reverse, unroll=unroll, _split_transpose=_split_transpose)

    (raw_carry, raw_ys), types = _retrying(run, list(tree.types))
    y_def: Any = y_info["treedef"]
    ys = y_def.unflatten([checked(op, r, t) for r, t in zip(raw_ys, y_info["types"], strict=True)])
    return tree.typed(raw_carry, types, op), ys


# --------------------------------------------------------------------------------- branches


def _branches(op: str, pred: Any, fns: Sequence[Callable[..., Any]], operands: tuple[Any, ...],
              bind: Callable[[Any, list[Callable[..., Any]], list[Any]], Any]) -> Any:
    req = _pred_req(pred)
    optree = _Tree(operands, "operands")
    info: dict[str, Any] = {}

    def run(preset: list[SpmdType] | None) -> Any:
        cur: dict[str, Any] = {"target": preset, "seen": []}

        def make(k: int, fn: Callable[..., Any]) -> Callable[..., Any]:
            def raw_branch(*raw_ops: Any) -> Any:
                ops = optree.typed(jax.tree_util.tree_leaves(raw_ops), optree.types, op) \
                    if optree.leaves else operands
                out = fn(*ops)
                with_path, tdef_ = jax.tree_util.tree_flatten_with_path(out, is_leaf=is_typed)
                tdef: Any = tdef_
                leaves = [x for _, x in with_path]
                paths = ["output" + jax.tree_util.keystr(p) for p, _ in with_path]
                got = [typeof(x) for x in leaves]
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
                cur["seen"].append(k)
                return tdef.unflatten([_cast(x, g, t) for x, g, t in zip(leaves, got, target, strict=True)])

            return raw_branch

        out = bind(unwrap(pred), [make(k, fn) for k, fn in enumerate(fns)], optree.raw())
        info["types"] = cur["target"]
        return out

    raw_out, _ = _retrying(run, None)  # type: ignore[arg-type]
    leaves = jax.tree_util.tree_leaves(raw_out)
    return info["treedef"].unflatten([checked(op, r, t) for r, t in zip(leaves, info["types"], strict=True)])


_MISSING = object()


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any,
         operand: Any = _MISSING) -> Any:
    """Typed `jax.lax.cond`: branches on typed values, outputs joined by free casts.

    Each output takes the join of its states in both branches (e.g. Invariant in one branch and
    Varying in the other gives Varying: the Invariant branch's value is `pvary`'d). A predicate
    that varies makes every output Varying on its axes (JAX types such outputs Invariant).

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
    if operand is not _MISSING:
        operands = (*operands, operand)
    return _branches("st.switch", index, list(branches), operands,
                     lambda p, fns, raw_ops: jax.lax.switch(
                         p, fns, *jax.tree_util.tree_unflatten(
                             jax.tree_util.tree_structure(operands, is_leaf=is_typed), raw_ops)))


__all__ = ["cond", "fori_loop", "scan", "switch", "while_loop"]
