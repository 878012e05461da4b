"""Programs of the communication report's tests (`test_report*.py`, the SPMD7xx cases of
`test_errors.py`): each flag with a program that raises it and a fixed one that does not,
gradient accumulation written both ways, a 3-D (data x fsdp x tp) step on any mesh, and
Explicit-mode programs. Each maker returns `(step, args)`; `LINES` holds the flagged lines.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

#: microbatches of the gradient-accumulation programs
MICRO = 4
D = 16


@functools.cache
def mesh_dp() -> Any:
    return jax.make_mesh((8,), ("dp",))


def _sds(mesh: Any, shape: tuple[int, ...], spec: P) -> Any:
    return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))


def _placed(mesh: Any, x: Any, spec: P) -> Any:
    return jax.device_put(x, NamedSharding(mesh, spec))


def _loss(w: Any, x: Any) -> Any:
    return jnp.mean(jnp.tanh(x @ w) ** 2)


# ------------------------------------------------------------- gradient accumulation


def _accum_per_micro(w: Any, xs: Any) -> Any:
    def body(acc: Any, x: Any) -> Any:
        g = jax.grad(_loss)(jax.lax.pcast(w, "dp", to="varying"), x)
        return acc + jax.lax.psum(g, "dp"), None   # flag: SPMD701

    acc, _ = jax.lax.scan(body, jnp.zeros_like(w), xs)
    return acc


def _accum_implicit(w: Any, xs: Any) -> Any:
    # w is Invariant: the transpose of the implicit pvary in _loss is a psum per microbatch
    def body(acc: Any, x: Any) -> Any:
        return acc + jax.grad(_loss)(w, x), None

    acc, _ = jax.lax.scan(body, jnp.zeros_like(w), xs)
    return acc


def _accum_deferred(w: Any, xs: Any) -> Any:
    wr = jax.lax.pcast(w, "dp", to="reduced")   # its gradient is Unreduced: no psum

    def body(acc: Any, x: Any) -> Any:
        return acc + jax.grad(_loss)(wr, x), None

    zero = jax.lax.pcast(jax.lax.pcast(jnp.zeros_like(w), "dp", to="varying"), "dp",
                         to="unreduced")
    acc, _ = jax.lax.scan(body, zero, xs)
    return jax.lax.psum(acc, "dp")               # once per step


def _accum_typed(w: Any, xs: Any) -> Any:
    """The deferred program written with spmdtyped: typed values inside st.shard_map."""
    wr = st.pcast(w, "dp", to="reduced")

    def body(acc: Any, x: Any) -> Any:
        return acc + st.grad(lambda p: st.numpy.mean(st.numpy.tanh(x @ p) ** 2))(wr), None

    zero = st.pcast(st.pvary(st.numpy.zeros_like(w), "dp"), "dp", to="unreduced")
    acc, _ = st.scan(body, zero, xs)
    return st.psum(acc, "dp")


ACCUM = {"per_micro": _accum_per_micro, "implicit": _accum_implicit,
         "deferred": _accum_deferred}


def accumulation(which: str, concrete: bool = False) -> tuple[Any, tuple[Any, ...]]:
    mesh = mesh_dp()
    smap = st.shard_map if which == "typed" else jax.shard_map
    f = _accum_typed if which == "typed" else ACCUM[which]
    step = jax.jit(smap(f, mesh=mesh, in_specs=(P(), P(None, "dp")), out_specs=P()))
    if concrete:
        w = np.random.default_rng(0).normal(size=(D, D)).astype(np.float32) / 4
        xs = np.random.default_rng(1).normal(size=(MICRO, 64, D)).astype(np.float32)
        return step, (_placed(mesh, w, P()), _placed(mesh, xs, P(None, "dp")))
    return step, (_sds(mesh, (D, D), P()), _sds(mesh, (MICRO, 64, D), P(None, "dp")))


# ------------------------------------------------------------- one flag each


def _double_psum(x: Any) -> Any:
    s = jax.lax.psum(x, "dp")
    return jax.lax.psum(s, "dp")   # flag: SPMD702


def _single_psum(x: Any) -> Any:
    return jax.lax.psum(x, "dp") * 8


def _kernel(a: Any) -> Any:
    return np.asarray(a) * 2


def _gather_callback(x: Any) -> Any:
    full = jax.lax.all_gather(x, "dp", tiled=True)   # flag: SPMD703
    y = jax.pure_callback(_kernel, jax.ShapeDtypeStruct(full.shape, full.dtype), full,
                          vmap_method="sequential")
    return y.sum()[None]


def _shard_callback(x: Any) -> Any:
    y = jax.pure_callback(_kernel, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                          vmap_method="sequential")
    return y.sum()[None]


def _psum_slice(x: Any) -> Any:
    i = jax.lax.axis_index("dp")
    total = jax.lax.psum(x, "dp")   # flag: SPMD704
    return jax.lax.dynamic_slice_in_dim(total, i * 2, 2)


def _psum_scatter(x: Any) -> Any:
    return jax.lax.psum_scatter(x, "dp", scatter_dimension=0, tiled=True)


FLAGGED = {"SPMD702": (_double_psum, _single_psum, P("dp"), P()),
           "SPMD703": (_gather_callback, _shard_callback, P("dp"), P("dp")),
           "SPMD704": (_psum_slice, _psum_scatter, P("dp"), P("dp"))}


def flagged(code: str, fixed: bool = False) -> tuple[Any, tuple[Any, ...]]:
    """The program that raises `code` (SPMD702-704), or its fixed twin."""
    bad, good, in_spec, out_spec = FLAGGED[code]
    mesh = mesh_dp()
    step = jax.jit(jax.shard_map(good if fixed else bad, mesh=mesh, in_specs=in_spec,
                                 out_specs=out_spec))
    return step, (_sds(mesh, (128, 4), in_spec),)


def line_of(fn: Any, marker: str) -> int:
    """The line of `fn`'s source file that holds `# flag: <marker>`."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, t in enumerate(lines) if f"flag: {marker}" in t)


# ------------------------------------------------------------- SPMD705: data-parallel volume
# An MLP's parameters as a dict, replicated over dp; the batch split over dp. Each step returns
# the SGD update and the loss; every version computes the same numbers.


def mlp_loss(p: Any, x: Any, y: Any) -> Any:
    h = jax.nn.relu(x @ p["w1"] + p["b1"])
    return jnp.mean((h @ p["w2"] - y) ** 2)


def _sgd(p: Any, g: Any) -> Any:
    return jax.tree.map(lambda w, d: w - 0.1 * d, p, g)


def _dp_tree(p: Any, x: Any, y: Any) -> Any:
    """The classic data-parallel step (check_vma=False): local gradients, one pmean each."""
    loss, grads = jax.value_and_grad(mlp_loss)(p, x, y)
    grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)
    return _sgd(p, grads), jax.lax.pmean(loss, "dp")


def _dp_tree_twice(p: Any, x: Any, y: Any) -> Any:
    """With the checks on, autodiff already sums the gradients of the replicated parameters
    (the pmean'd loss); the habit of pmean'ing them again reduces every gradient twice, and
    changes no number: a pmean of an Invariant value is the value."""
    loss, grads = jax.value_and_grad(lambda p: jax.lax.pmean(mlp_loss(p, x, y), "dp"))(p)
    grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)   # flag: SPMD705
    return _sgd(p, grads), loss


def _dp_flat(p: Any, x: Any, y: Any) -> Any:
    """One flattened buffer for all gradients (check_vma=False), reduced once."""
    loss, grads = jax.value_and_grad(mlp_loss)(p, x, y)
    flat, unravel = ravel_pytree(grads)
    return _sgd(p, unravel(jax.lax.pmean(flat, "dp"))), jax.lax.pmean(loss, "dp")


def _dp_flat_micro(p: Any, x: Any, y: Any) -> Any:
    """Gradient accumulation over MICRO microbatches, the flattened buffer reduced in each."""
    xs = x.reshape(MICRO, -1, x.shape[-1])
    ys = y.reshape(MICRO, -1, y.shape[-1])
    flat0, unravel = ravel_pytree(jax.tree.map(jnp.zeros_like, p))

    def body(carry: Any, batch: Any) -> Any:
        acc, total = carry
        loss, grads = jax.value_and_grad(mlp_loss)(p, *batch)
        flat, _ = ravel_pytree(grads)
        acc = acc + jax.lax.pmean(flat, "dp")   # flag: SPMD705
        return (acc, total + loss), None

    (acc, total), _ = jax.lax.scan(body, (flat0, jnp.zeros(())), (xs, ys))
    return _sgd(p, unravel(acc / MICRO)), jax.lax.pmean(total / MICRO, "dp")


#: name -> (body, check_vma)
DP_STEPS = {"tree": (_dp_tree, False), "tree_twice": (_dp_tree_twice, True),
            "flat": (_dp_flat, False), "flat_micro": (_dp_flat_micro, False)}


def dp_params() -> dict[str, Any]:
    k = jax.random.split(jax.random.key(3), 3)
    return {"w1": jax.random.normal(k[0], (D, 2 * D)) / 4, "b1": jnp.zeros((2 * D,)),
            "w2": jax.random.normal(k[1], (2 * D, 4)) / 4}


def dp_batch() -> tuple[Any, Any]:
    k = jax.random.split(jax.random.key(4), 2)
    return jax.random.normal(k[0], (128, D)), jax.random.normal(k[1], (128, 4))


def dp_step(which: str) -> tuple[Any, tuple[Any, ...]]:
    """A data-parallel step over dp=8 with placed arguments (params, x, y)."""
    body, check_vma = DP_STEPS[which]
    mesh = mesh_dp()
    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp"), P("dp")),
                                 out_specs=P(), check_vma=check_vma))
    x, y = dp_batch()
    return step, (_placed(mesh, dp_params(), P()), _placed(mesh, x, P("dp")),
                  _placed(mesh, y, P("dp")))


# ------------------------------------------------------------- data x fsdp x tp


def three_d(mesh: Any, batch: int = 128, d: int = 64, h: int = 128
            ) -> tuple[Any, tuple[Any, ...]]:
    """A 3-D parallel training step (forward and backward) on `mesh` (a Mesh or an
    AbstractMesh with axes data, fsdp, tp): weights sharded over fsdp x tp and gathered over
    fsdp, activations reduced over tp, the batch over data x fsdp."""
    w_specs = (P("fsdp", "tp"), P("tp", "fsdp"))

    def body(w1: Any, w2: Any, x: Any) -> Any:
        def loss(w1: Any, w2: Any) -> Any:
            a = jax.lax.all_gather(w1, "fsdp", axis=0, tiled=True)
            b = jax.lax.all_gather(w2, "fsdp", axis=1, tiled=True)
            y = jax.lax.psum(jnp.tanh(x @ a) @ b, "tp")
            return jnp.mean(y ** 2)

        value, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        return g1, g2, jax.lax.pmean(value, ("data", "fsdp"))

    step = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(*w_specs, P(("data", "fsdp"))),
                                 out_specs=(*w_specs, P())))
    return step, (_sds(mesh, (d, h), w_specs[0]), _sds(mesh, (h, d), w_specs[1]),
                  _sds(mesh, (batch, d), P(("data", "fsdp"))))


# ------------------------------------------------------------- Explicit mode


@functools.cache
def mesh_explicit() -> Any:
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)


def explicit_gather(x: Any) -> Any:
    return jax.sharding.reshard(x, P()) * 2.0            # all-gather over dp


def explicit_unreduced(a: Any, b: Any) -> Any:
    c = jnp.einsum("ij,jk->ik", a, b, out_sharding=P(unreduced={"tp"}))
    return jax.sharding.reshard(c, P())                  # all-reduce over tp


def explicit(which: str) -> tuple[Any, tuple[Any, ...]]:
    mesh = mesh_explicit()
    if which == "gather":
        return explicit_gather, (_placed(mesh, jnp.ones((16, 4)), P("dp")),)
    return explicit_unreduced, (_placed(mesh, jnp.ones((8, 16)), P(None, "tp")),
                                _placed(mesh, jnp.ones((16, 8)), P("tp")))
