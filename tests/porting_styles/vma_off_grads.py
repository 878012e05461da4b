"""Pre-vma data-parallel SGD (`check_vma=False`): the gradients of the replicated parameters are
per-device, so the code psums them itself. Turning `check_vma` on without removing that psum
counts them twice (JAX then sums them in the transpose of the implicit pvary)."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("tp", 4))
IN_SPECS = (P(), P("dp"), P("dp"))
OUT_SPECS = (P(), P())
CHECK_VMA = False


def sgd(w, x, y):
    def loss_fn(w):
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    loss, g = jax.value_and_grad(loss_fn)(w)
    g = jax.lax.psum(g, "dp") / 2  # VMA: SPMD103
    return w - 0.1 * g, jax.lax.pmean(loss, "dp")


def sgd_bug(w, x, y):
    # ported by flipping check_vma=True and keeping the explicit gradient psum
    def loss_fn(w):
        return jnp.mean((jnp.tanh(x @ w) - y) ** 2)

    loss, g = jax.value_and_grad(loss_fn)(w)
    g = jax.lax.psum(g, "dp") / 2  # BUG: SPMD103
    return w - 0.1 * g, jax.lax.pmean(loss, "dp")


ENTRY, BUGS = "sgd", ("sgd_bug",)
CHECK = {"sgd": False, "sgd_bug": True}


def run(mesh, fn, *args, check_vma=None):
    cv = CHECK[fn.__name__] if check_vma is None else check_vma
    return jax.shard_map(fn, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS, check_vma=cv)(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(4), 3)
    raw = (jax.random.normal(k[0], (8, 4)), jax.random.normal(k[1], (16, 8)),
           jax.random.normal(k[2], (16, 4)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
