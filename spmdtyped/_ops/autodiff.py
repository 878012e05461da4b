"""Typed autodiff: `st.grad`, `st.value_and_grad`, `st.vjp`, `st.cotangent_type`.

jax's signatures, on functions of typed values inside shard_map. Typed arguments are unwrapped
at the boundary, JAX differentiates the raw function (so the program is exactly the one
`jax.grad` builds: pvary transposes to psum, all_gather to psum_scatter, ...), and the
cotangents come back typed with the state JAX gives them: the primal's state with Unreduced
and Reduced swapped (`_rules.cotangent`, reference §5). A ZeRO step is therefore typed end to
end: a parameter gathered with `st.all_gather(w, "dp", to="reduced")` is `Reduced["dp"]`, its
gradient `Unreduced["dp"]`, reduced with `st.psum_scatter`.

Gradients carry the cotangent of their primal's refinement (`refine_shape.cotangent`): the
gradient of a Rep value (a pvary'd copy) is Partial (per-device terms of the total), of a
Partial value Rep, of a Shard the same Shard. `st.grad` of a Partial loss is the gradient of
the global sum (JAX seeds every device's term). Under `jax.vmap` a per-example loss Varying
over an axis, differentiated w.r.t. a parameter Invariant there, is SPMD407: JAX would sum
each per-example gradient over the devices (jax#36886); strict, since the sum of the
per-example gradients over the batch is the right total.

Plain `jax.grad` / `jax.value_and_grad` (and `eqx.filter_grad`, which calls them) of a function
of typed values or of a typed loss are `st.value_and_grad`'s: the `vjp` they call is hooked
(`_jax_grad_vjp`, `_compat.hook_grad_vjp`), since JAX seeds a raw cotangent that cannot match
the structure of a typed loss. `jax.vjp` works on functions of typed values as they are
pytrees: a cotangent rebuilt around a JAX value whose state differs from the primal's class
gets the class of its own state (`_array._unflatten`).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import numpy as np

from .. import _compat, _rules, _validate
from .._errors import error
from .._rules import SpmdType
from .._rules.refine import REP as _REP
from .._rules.refine import Refinement
from .._rules.refine import shape as _refine
from .._typed.array import checked, is_typed, refinement_of, typeof, unwrap

# JAX's transpose of scan/while mistypes the Unreduced cotangents of Reduced carries and loop
# constants (jax 0.10.2 and 0.12.0.1, same texts): translated to SPMD406
_LOOP_TRANSPOSE = ("Scan carry input and output got mismatched varying manual axes",
                   "Expected cotangent type")
_UR_AXES = re.compile(r"[UR]:\(?([A-Za-z_][\w,]*)\)?")


@contextlib.contextmanager
def _loop_transpose_errors(op: str) -> Iterator[None]:
    try:
        yield
    except ValueError as e:
        msg = str(e)
        if not any(m in msg for m in _LOOP_TRANSPOSE) or not _UR_AXES.search(msg):
            raise
        axes = sorted({a for m in _UR_AXES.finditer(msg) for a in m.group(1).split(",")})
        raise error("SPMD406", f"{op}: JAX cannot differentiate a loop whose carry or closed-over "
                    f"values are Reduced over {axes}: its transpose mistypes their Unreduced "
                    f"cotangents", axes=axes, states={a: "reduced" for a in axes}, op=op,
                    details=(f"jax: {msg.splitlines()[0][:240]}",),
                    fix=f"cast them to Varying before the loop: w = st.pcast(w, "
                        f"{axes[0]!r}, to='varying') (free; the gradient of w stays "
                        f"Unreduced)") from None


class _Args:
    """Flattened arguments: typed leaves remembered, so a raw function can re-wrap them."""

    def __init__(self, args: Any) -> None:
        leaves, treedef = jax.tree_util.tree_flatten(args, is_leaf=is_typed)
        self.treedef: Any = treedef
        self.types = [typeof(x) if _is_value(x) else None for x in leaves]
        self.refs = [refinement_of(x) for x in leaves]
        self.mask = [is_typed(x) for x in leaves]
        self.raw = _unflatten(treedef, [unwrap(x) for x in leaves])

    def part(self, k: int) -> _Args:
        """The `_Args` of element `k` of the tuple these are the leaves of (`_Args(args[k])`,
        from the leaves already read)."""
        children = self.treedef.children()
        start = sum(c.num_leaves for c in children[:k])
        stop = start + children[k].num_leaves
        got = object.__new__(_Args)
        got.treedef = children[k]
        got.types, got.refs = self.types[start:stop], self.refs[start:stop]
        got.mask, got.raw = self.mask[start:stop], self.raw[k]
        return got

    def rewrap(self, raw: Any, op: str) -> Any:
        leaves = self.treedef.flatten_up_to(raw)
        # a typed node around None (a leaf `eqx.partition` filtered out) has no JAX value
        return self.treedef.unflatten([checked(op, r, t, f) if m and t is not None
                                       and r is not None else r
                                       for r, t, m, f in zip(leaves, self.types, self.mask,
                                                             self.refs, strict=True)])

    def cotangents(self, raw_cts: Any, op: str, typed_only: bool = False) -> Any:
        """The cotangents typed by the cotangent rule (`typed_only`: only those of typed
        primals; raw primals keep the raw cotangents JAX gives them)."""
        leaves = self.treedef.flatten_up_to(raw_cts)
        return self.treedef.unflatten([_wrap_ct(r, t, f, op) if m or not typed_only else r
                                       for r, t, f, m in zip(leaves, self.types, self.refs,
                                                             self.mask, strict=True)])

    def named_types(self, name: str) -> list[tuple[str, SpmdType]]:
        """(name, state) of each value leaf, for messages."""
        with_path = jax.tree_util.tree_flatten_with_path(
            self.treedef.unflatten([0] * self.treedef.num_leaves))[0]
        return [(name + jax.tree_util.keystr(p), t)
                for (p, _), t in zip(with_path, self.types, strict=True) if t is not None]


def _unflatten(treedef: Any, leaves: list[Any]) -> Any:
    return treedef.unflatten(leaves)


def _is_value(x: Any) -> bool:
    return is_typed(x) or isinstance(x, (jax.Array, jax.core.Tracer, np.ndarray, np.generic,
                                         int, float, complex))


def _wrap_ct(raw: Any, primal: SpmdType | None, ref: Refinement, op: str) -> Any:
    """A cotangent typed by the cotangent rule: the state with Unreduced and Reduced swapped,
    the refinement with Rep and Partial swapped (Shard and Invariant kept)."""
    if primal is None or raw is None or getattr(raw, "dtype", None) == jax.dtypes.float0:
        return raw  # integer inputs get float0 cotangents: no state
    ct = _rules.cotangent(primal)
    return checked(op, raw, ct, _refine.cotangent(ref).restrict(ct.varying))


def _seed_rep(raw: Any, t: SpmdType, ref: Refinement) -> Any:
    """The loss JAX differentiates. JAX seeds every device's copy of a Varying loss with 1,
    which differentiates the sum of the copies: right for a Partial loss (the global sum) and
    a plain one, but `n` times the gradient for a Rep loss (one value held by the `n` devices
    of the axis). A Rep loss is seeded with `1 / n` over its Rep axes instead, so that its
    gradients are those of the value itself (and a Rep parameter's Partial gradient sums to
    it)."""
    rep = tuple(a for a, k in ref.items if k is _REP and a in t.varying)
    if not rep:
        return raw
    return raw / _compat.axis_size(rep if len(rep) > 1 else rep[0])


def _check_loss(loss: Any, diff: Callable[[], list[tuple[str, SpmdType]]], op: str
                ) -> tuple[SpmdType, Refinement]:
    """The state and refinement of a loss to differentiate, after the loss checks of `st.grad`
    (SPMD405 for an Unreduced loss, SPMD407 for per-example gradients under `vmap`); shared by
    `st.value_and_grad` and the `jax.grad` route (`_grad_vjp`). `diff()`: the differentiated
    leaves' names and states, read only for SPMD407 (a pytree path per leaf costs tens of us:
    a 768-parameter model's loss would pay for them at every trace)."""
    t = typeof(loss)
    _rules.grad_loss_type(t, _compat.FEATURES, op=op)
    _check_vmap(loss, t, diff, op)
    return t, refinement_of(loss)


def _check_vmap(loss: Any, loss_t: SpmdType, diff: Callable[[], list[tuple[str, SpmdType]]],
                op: str) -> None:
    """SPMD407: a per-example (vmap-batched) loss Varying where a differentiated parameter is
    Invariant: JAX would sum each per-example gradient over the devices (jax#36886)."""
    if loss_t.varying and _compat.is_batched(unwrap(loss)):
        _rules.check_vmap_grad(loss_t, diff(), op=op)


def cotangent_type(x: Any) -> SpmdType:
    """The state of the cotangent of `x`: its state with Unreduced and Reduced swapped.

    **Arguments:**

    - `x`: a typed value, or a raw JAX value inside shard_map, or an `SpmdType`.

    **Returns:** an `SpmdType`, e.g. `Unreduced['dp']` for a `Reduced['dp']` value.

    !!! Example
        ```python
        st.cotangent_type(w)      # w: Reduced["dp"] -> SpmdType(Unreduced['dp'])
        ```
    """
    return _rules.cotangent(x if isinstance(x, SpmdType) else typeof(x))


def vjp(fun: Callable[..., Any], *primals: Any, has_aux: bool = False) -> Any:
    """Typed `jax.vjp`: `(out, pullback)` (or `(out, pullback, aux)`) on typed values.

    The pullback takes cotangents in the state `st.cotangent_type(out)` (typed or raw) and
    returns one typed cotangent per primal, in the primal's state with Unreduced and Reduced
    swapped.

    **Arguments:** as `jax.vjp`: `fun` takes and returns (pytrees of) typed or raw values.

    **Returns:** `(out, pullback)`, or `(out, pullback, aux)` with `has_aux=True`; `out` typed.

    **Raises:** `BoundaryError` SPMD404 when a cotangent passed to the pullback has the wrong
    state (before JAX's `unexpected JAX type ... for argument to VJP function`).

    !!! Example
        ```python
        y, pull = st.vjp(lambda w: (x * w).sum(), w)    # w: Reduced["dp"], x: Varying["dp"]
        (g,) = pull(jnp.ones_like(y.raw))               # y: Varying["dp"]; g: Unreduced["dp"]
        ```
    """
    op = "st.vjp"
    _validate.callable_arg(fun, op)
    args = _Args(primals)
    info: dict[str, Any] = {}

    def raw_fun(*raw_args: Any) -> Any:
        res = fun(*args.rewrap(raw_args, op))
        if has_aux:
            if not (isinstance(res, tuple) and len(res) == 2):
                raise TypeError(f"{op}: with has_aux=True the function must return a pair "
                                f"(out, aux), got {type(res).__name__}")
            out, aux = res
        leaves, treedef = jax.tree_util.tree_flatten(out if has_aux else res, is_leaf=is_typed)
        info["types"], info["treedef"] = [typeof(x) for x in leaves], treedef
        info["refs"] = [refinement_of(x) for x in leaves]
        raw_out = _unflatten(treedef, [unwrap(x) for x in leaves])
        return (raw_out, aux) if has_aux else raw_out

    res: Any = jax.vjp(raw_fun, *args.raw, has_aux=has_aux)  # type: ignore[call-overload]
    raw_out, raw_pull = res[0], res[1]
    out_def: Any = info["treedef"]
    out_types: list[SpmdType] = info["types"]
    out = out_def.unflatten([checked(op, r, t, f) for r, t, f in
                             zip(out_def.flatten_up_to(raw_out), out_types, info["refs"], strict=True)])

    def pullback(ct: Any) -> Any:
        with_path, ct_def = jax.tree_util.tree_flatten_with_path(ct, is_leaf=is_typed)
        if ct_def == out_def:
            for (path, leaf), t in zip(with_path, out_types, strict=True):
                _rules.check_cotangent(t, typeof(leaf), op=f"{op} pullback",
                                       what="output" + jax.tree_util.keystr(path))
        # a structure mismatch is not a state problem: JAX reports it
        with _loop_transpose_errors(f"{op} pullback"):
            raw_cts = raw_pull(jax.tree_util.tree_map(unwrap, ct, is_leaf=is_typed))
        return args.cotangents(raw_cts, op)

    return (out, pullback, res[2]) if has_aux else (out, pullback)


def value_and_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0,
                   has_aux: bool = False, holomorphic: bool = False,
                   allow_int: bool = False) -> Callable[..., Any]:
    """Typed `jax.value_and_grad`: the loss (typed) and typed gradients.

    The loss must be an Invariant or Varying scalar (typed or raw). `grad` of a Varying loss
    sums the per-device gradients of Invariant parameters (JAX transposes the implicit pvary to
    a psum) and leaves the gradients of Reduced parameters Unreduced, for `st.psum_scatter`.

    **Arguments:** as `jax.value_and_grad`.

    **Returns:** a function returning `(loss, grads)` or `((loss, aux), grads)`; each gradient
    leaf is typed with its parameter's cotangent state (`st.cotangent_type`).

    **Raises:** `BoundaryError` SPMD405 for an Unreduced or Reduced loss.

    !!! Example
        ```python
        loss, g = st.value_and_grad(loss_fn)(w, x)   # w: Reduced["dp"] -> g: Unreduced["dp"]
        g = st.psum_scatter(g, "dp", tiled=True)     # Varying["dp"]: this device's shard
        ```
    """
    return _value_and_grad(fun, argnums, has_aux, holomorphic, allow_int, "st.value_and_grad")


def _value_and_grad(fun: Callable[..., Any], argnums: int | Sequence[int], has_aux: bool,
                    holomorphic: bool, allow_int: bool, op: str) -> Callable[..., Any]:
    _validate.callable_arg(fun, op)
    _validate.argnums_arg(argnums, 1 << 30, op)  # the form now; the range at the call

    def value_and_grad_f(*call_args: Any, **kwargs: Any) -> Any:
        args = _Args(call_args)
        info: dict[str, Any] = {}
        nums = _validate.argnums_arg(argnums, len(call_args), op)
        for k in nums:
            for leaf in jax.tree_util.tree_leaves(call_args[k], is_leaf=is_typed):
                if not _is_value(leaf):
                    raise _validate.not_an_array(leaf, op)
        per_arg = [args.part(k) for k in nums]

        def diff() -> list[tuple[str, SpmdType]]:
            return [nt for k, a in zip(nums, per_arg, strict=True)
                    for nt in a.named_types(f"argument {k}")]

        def raw_fun(*raw_args: Any, **kw: Any) -> Any:
            res = fun(*args.rewrap(raw_args, op), **kw)
            if has_aux:
                if not (isinstance(res, tuple) and len(res) == 2):
                    raise TypeError(f"{op}: with has_aux=True the function must return a pair "
                                    f"(loss, aux), got {type(res).__name__}")
                loss, aux = res
            else:
                loss, aux = res, None
            raw = unwrap(loss)
            if not _is_value(raw) or getattr(raw, "shape", ()) != ():  # before JAX's error
                raise _validate.bad(op, "the function's output (the loss)", raw,
                                    "a scalar", "return a scalar: loss.sum() or st.psum(...)")
            seeded = raw
            if is_typed(loss) or isinstance(loss, (jax.Array, jax.core.Tracer)):
                info["type"], info["ref"] = _check_loss(loss, diff, op)
                seeded = _seed_rep(raw, info["type"], info["ref"])
            # the seeded loss is differentiated; the loss itself is returned as it is
            return seeded, (raw, aux)

        with _loop_transpose_errors(op):
            res, raw_grads = jax.value_and_grad(raw_fun, argnums, has_aux=True,
                                                holomorphic=holomorphic,
                                                allow_int=allow_int)(*args.raw, **kwargs)
        raw_loss, aux = res[1]
        loss = checked(op, raw_loss, info["type"], info["ref"]) if "type" in info else raw_loss
        grads = [a.cotangents(g, op) for a, g in
                 zip(per_arg, (raw_grads,) if isinstance(argnums, int) else raw_grads, strict=True)]
        out_grads = grads[0] if isinstance(argnums, int) else tuple(grads)
        return ((loss, aux) if has_aux else loss), out_grads

    value_and_grad_f.__name__ = f"value_and_grad({getattr(fun, '__name__', 'fun')})"
    value_and_grad_f.__doc__ = fun.__doc__
    return value_and_grad_f


def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False,
         holomorphic: bool = False, allow_int: bool = False) -> Callable[..., Any]:
    """Typed `jax.grad`: typed gradients in the cotangent states JAX gives them.

    **Arguments:** as `jax.grad`; the loss is an Invariant or Varying scalar (typed or raw).

    **Returns:** a function returning the gradients (and `aux` with `has_aux=True`), typed:
    Invariant parameters get Invariant gradients (already summed over the axes the loss varies
    on), Varying ones Varying, Reduced ones Unreduced, Unreduced ones Reduced.

    **Raises:** `BoundaryError` SPMD405 for an Unreduced or Reduced loss.

    !!! Example
        ```python
        def loss_fn(w: st.Reduced["dp"], x: st.Varying["dp"]) -> st.Varying["dp"]:
            return ((x @ w) ** 2).sum()
        g = st.grad(loss_fn)(w, x)                   # Unreduced["dp"]
        ```
    """
    vg = _value_and_grad(fun, argnums, has_aux, holomorphic, allow_int, "st.grad")

    def grad_f(*args: Any, **kwargs: Any) -> Any:
        value, g = vg(*args, **kwargs)
        return (g, value[1]) if has_aux else g

    grad_f.__name__ = f"grad({getattr(fun, '__name__', 'fun')})"
    grad_f.__doc__ = fun.__doc__
    return grad_f


# ------------------------------------------------------------------- jax.grad of typed values


def _jax_grad_vjp(jax_vjp: Callable[..., Any]) -> Callable[..., Any]:
    """The `vjp` that `jax.grad` / `jax.value_and_grad` (and equinox's filter_grad through
    them) call (`_compat.hook_grad_vjp`): on functions of typed values, or returning a typed
    loss, it is `st.value_and_grad`'s; every other call is JAX's own, unchanged."""

    def vjp(fun: Callable[..., Any], *primals: Any, has_aux: bool = False, **kw: Any) -> Any:
        site = _compat.grad_call_site(1)
        if site is None or kw:
            return jax_vjp(fun, *primals, has_aux=has_aux, **kw)
        return _grad_vjp(jax_vjp, fun, primals, has_aux, *site)

    return vjp


def _grad_vjp(jax_vjp: Callable[..., Any], fun: Callable[..., Any], primals: tuple[Any, ...],
              has_aux: bool, op: str, argnums: Any) -> Any:
    """`jax_vjp(fun, *primals)` for `jax.value_and_grad`: typed primals enter `fun` typed with
    their refinements, a typed loss leaves it as its JAX value (so JAX's seed of ones matches
    its structure) and comes back typed, and the gradients of typed primals are typed by the
    cotangent rule, with the loss checks of `st.grad` (SPMD405, SPMD407): the result is
    `st.value_and_grad`'s. Raw primals keep JAX's raw gradients."""
    typed_in = any(is_typed(x) for x in jax.tree_util.tree_leaves(primals, is_leaf=is_typed))
    args = _Args(primals) if typed_in else None
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    info: dict[str, Any] = {}

    def differentiated() -> list[tuple[str, SpmdType]]:
        return [nt for k, p in zip(nums, primals, strict=False)
                for nt in _Args(p).named_types(f"argument {k}")]

    @functools.wraps(fun)
    def raw_fun(*raw_args: Any) -> Any:
        res = fun(*args.rewrap(raw_args, op)) if args is not None else fun(*raw_args)
        if has_aux and not (isinstance(res, tuple) and len(res) == 2):
            return res  # JAX's own error for a malformed (loss, aux)
        out, aux = res if has_aux else (res, None)
        leaves, treedef = jax.tree_util.tree_flatten(out, is_leaf=is_typed)
        mask = [is_typed(x) for x in leaves]
        if args is None and not any(mask):
            return res  # nothing typed: JAX's own
        if len(leaves) == 1 and (mask[0] or isinstance(leaves[0], (jax.Array, jax.core.Tracer))):
            info["loss"] = _check_loss(leaves[0], differentiated, op)
        info.update(treedef=treedef, mask=mask, refs=[refinement_of(x) for x in leaves],
                    types=[typeof(x) if m else None for x, m in zip(leaves, mask, strict=True)])
        raw_out = _unflatten(treedef, [unwrap(x) for x in leaves])
        return (raw_out, aux) if has_aux else raw_out

    with _loop_transpose_errors(op):
        res = jax_vjp(raw_fun, *(args.raw if args is not None else primals), has_aux=has_aux)
    if not info:
        return res
    out_def: Any = info["treedef"]
    out = out_def.unflatten([checked(op, r, t, f) if m else r for r, t, f, m in zip(
        out_def.flatten_up_to(res[0]), info["types"], info["refs"], info["mask"], strict=True)])
    raw_pull = res[1]

    def pullback(ct: Any) -> Any:
        raw_ct = jax.tree_util.tree_map(unwrap, ct, is_leaf=is_typed)
        if "loss" in info:  # the seed of a Rep loss, as `st.value_and_grad` seeds it (linear)
            raw_ct = jax.tree_util.tree_map(lambda c: _seed_rep(c, *info["loss"]), raw_ct)
        with _loop_transpose_errors(op):
            raw_cts = raw_pull(raw_ct)
        return raw_cts if args is None else args.cotangents(raw_cts, op, typed_only=True)

    return (out, pullback, *res[2:])


_compat.hook_grad_vjp(_jax_grad_vjp)

__all__ = ["cotangent_type", "grad", "value_and_grad", "vjp"]
