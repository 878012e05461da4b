"""Routing `jax.grad` / `jax.value_and_grad` / `jax.vjp` while `infer` traces a body
(issue 15, item 7): each gradient passes through a marker `jit` with its primal, which the
refinement walk (`_refine_walk`) types by the cotangent rule; a gradient traced under
`jax.vmap` of a per-example loss is marked with the loss's varying axes (SPMD407). The
numbers are unchanged: the markers are identities.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax

from .. import _compat
from .._typed import array as _array
from .._typed.hints import is_state_class
from .patching import Patch

#: markers left in the jaxpr: `spmdtyped_mark(primal, cotangent, name=...) -> cotangent`
CT_MARK = "spmdtyped_cotangent"
PER_EXAMPLE_MARK = "spmdtyped_per_example_cotangent"

def _make_mark_primitive() -> Any:
    """`spmdtyped_mark(primal, ct, name=...) -> ct`: an identity that lowers to nothing (the
    compiled program is the one without it), linear in `ct`, batched and transposed as an
    identity. Only the refinement walk reads it."""
    from jax.extend.core import Primitive
    from jax.interpreters import ad, batching, mlir

    prim = Primitive(MARK_PRIMITIVE)
    prim.def_impl(lambda primal, ct, *, name: ct)
    prim.def_abstract_eval(lambda primal, ct, *, name: ct)
    mlir.register_lowering(prim, lambda ctx, primal, ct, *, name: [ct])

    def jvp(primals: Any, tangents: Any, *, name: str) -> Any:
        return primals[1], ad.instantiate_zeros(tangents[1])

    def transpose(t: Any, primal: Any, ct: Any, *, name: str) -> Any:
        return None, t

    def batch(args: Any, dims: Any, *, name: str) -> Any:
        return prim.bind(args[0], args[1], name=name), dims[1]

    ad.primitive_jvps[prim] = jvp
    ad.primitive_transposes[prim] = transpose
    batching.primitive_batchers[prim] = batch
    return prim


#: the marker's primitive name (the walks recognise it by this name)
MARK_PRIMITIVE = "spmdtyped_mark"
_MARK = _make_mark_primitive()


def _mark(primal: Any, ct: Any, name: str) -> Any:
    """`ct`, returned through the marker primitive named `name` that also takes `primal`:
    the walk types the result by the cotangent rule of `primal`'s refinement."""
    if ct is None or not isinstance(ct, (jax.Array, jax.core.Tracer)) \
            or getattr(ct, "dtype", None) == jax.dtypes.float0:
        return ct
    if not isinstance(primal, (jax.Array, jax.core.Tracer)):
        return ct
    return _MARK.bind(primal, ct, name=name)


def _marked_tree(primals: Any, cts: Any, name: str) -> Any:
    def one(p: Any, c: Any) -> Any:
        if is_state_class(type(c)):  # a typed gradient keeps its refinement, its array marked
            return _array.with_raw(c, _mark(_array.unwrap(p), c.raw, name))
        return _mark(p, c, name)

    try:
        return jax.tree_util.tree_map(one, primals, cts, is_leaf=lambda x: is_state_class(type(x)))
    except (ValueError, TypeError):
        return cts


def _routed_value_and_grad(orig: Callable[..., Any], fun: Callable[..., Any],
                           argnums: int | Sequence[int] = 0, has_aux: bool = False,
                           **kw: Any) -> Callable[..., Any]:
    state: dict[str, Any] = {}

    @functools.wraps(fun)
    def inner(*args: Any, **kwargs: Any) -> Any:
        res = fun(*args, **kwargs)
        loss = res[0] if has_aux else res
        try:
            t = _compat.typeof_raw(loss)
            batched = bool(t.varying) and _compat.is_batched(loss)
            state["loss_axes"] = tuple(sorted(t.varying)) if batched else ()
        except TypeError:
            state["loss_axes"] = ()
        return res

    vg = orig(inner, argnums, has_aux=has_aux, **kw)

    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        value, grads = vg(*args, **kwargs)
        nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        prim = args[nums[0]] if isinstance(argnums, int) else tuple(args[k] for k in nums)
        axes = state.get("loss_axes", ())
        name = "__".join((PER_EXAMPLE_MARK, *axes)) if axes else CT_MARK
        return value, _marked_tree(prim, grads, name)

    return call


def _unless_typed(routed: Callable[..., Any], own: Callable[..., Any], fun: Callable[..., Any],
                  argnums: Any, marked: Callable[[Any, Callable[[Any], Any]], Any]
                  ) -> Callable[..., Any]:
    """`routed` for raw arguments; JAX's own for typed ones (`st.Array`s: the typed runtime
    refines their gradient itself, through `_compat.hook_grad_vjp`, and names `jax.grad`),
    whose gradients' arrays are marked all the same (`marked(out, mark)` marks the gradients
    in JAX's result): a raw collective the body applies to them is checked by the walk."""
    @functools.wraps(fun)
    def call(*args: Any, **kwargs: Any) -> Any:
        typed = any(is_state_class(type(leaf)) for leaf in
                    jax.tree_util.tree_leaves((args, kwargs),
                                              is_leaf=lambda x: is_state_class(type(x))))
        if not typed:
            return routed(*args, **kwargs)
        nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
        prim = args[nums[0]] if isinstance(argnums, int) else tuple(args[k] for k in nums)
        return marked(own(*args, **kwargs), lambda grads: _marked_tree(prim, grads, CT_MARK))

    return call


def _autodiff_routes(originals: Mapping[tuple[Any, str], Any]) -> dict[tuple[Any, str], Any]:
    """`jax.grad` / `jax.value_and_grad` / `jax.vjp` marking each gradient (see
    `routed_autodiff`), each calling JAX's own (`originals`)."""
    vg_orig = originals[(jax, "value_and_grad")]
    grad_orig = originals[(jax, "grad")]
    vjp_orig = originals[(jax, "vjp")]

    def value_and_grad(fun: Callable[..., Any], argnums: Any = 0, has_aux: bool = False,
                       **kw: Any) -> Callable[..., Any]:
        routed = _routed_value_and_grad(vg_orig, fun, argnums, has_aux, **kw)
        own = vg_orig(fun, argnums, has_aux=has_aux, **kw)
        return _unless_typed(routed, own, fun, argnums,
                             lambda out, mark: (out[0], mark(out[1])))

    def grad(fun: Callable[..., Any], argnums: Any = 0, has_aux: bool = False,
             **kw: Any) -> Callable[..., Any]:
        vg = _routed_value_and_grad(vg_orig, fun, argnums, has_aux, **kw)

        @functools.wraps(fun)
        def g(*args: Any, **kwargs: Any) -> Any:
            value, grads = vg(*args, **kwargs)
            return (grads, value[1]) if has_aux else grads

        return _unless_typed(g, grad_orig(fun, argnums, has_aux=has_aux, **kw), fun, argnums,
                             lambda out, mark: (mark(out[0]), out[1]) if has_aux else mark(out))

    def vjp(fun: Callable[..., Any], *primals: Any, **kw: Any) -> Any:
        res = vjp_orig(fun, *primals, **kw)
        pull = res[1]

        def pullback(ct: Any) -> Any:
            return _marked_tree(tuple(primals), pull(ct), CT_MARK)

        return (res[0], pullback, *res[2:])

    return {(jax, "grad"): grad, (jax, "value_and_grad"): value_and_grad, (jax, "vjp"): vjp}


_AUTODIFF_ROUTE = Patch(((jax, "grad"), (jax, "value_and_grad"), (jax, "vjp")), _autodiff_routes)


@contextlib.contextmanager
def routed_autodiff() -> Iterator[None]:
    """Route `jax.grad`, `jax.value_and_grad` and `jax.vjp` while a body is traced for infer:
    each gradient (each pullback's cotangent) is passed through a marker `jit` with its primal,
    which the refinement walk types by the cotangent rule. The numbers are unchanged."""
    with _AUTODIFF_ROUTE.active():
        yield


def trace_discarding_outputs(f: Callable[..., Any], sds: Sequence[Any], *, mesh: Any,
                             in_specs: Any, axis_names: Any) -> Any | None:
    """The jaxpr of `f`'s body when JAX rejects the program at its out_specs (e.g. a loss
    that still varies, class 8): traced with the outputs replaced by a replicated zero, so
    the refinement walk still sees every equation. None when even that fails."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec

    def body(*a: Any) -> Any:
        f(*a)
        return jnp.zeros((), jnp.float32)

    try:
        with routed_autodiff():
            return jax.make_jaxpr(_compat.shard_map(body, mesh=mesh, in_specs=in_specs,
                                                    out_specs=PartitionSpec(),
                                                    axis_names=axis_names, check_vma=True))(*sds)
    except Exception:  # noqa: BLE001 - a program JAX rejects for another reason: nothing to walk
        return None
