"""FSDP: parameters sharded over dp, all_gather'd for the forward pass; the gradient comes
back reduce-scattered (the transpose of all_gather)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IN_SPECS = (P("dp"), P("dp"), P("dp"))
OUT_SPECS = (P("dp"), P())


def step(w_shard, x, y):
    def loss_fn(ws):
        w = lax.all_gather(ws, "dp", tiled=True)
        return jnp.mean((x @ w - y) ** 2)

    loss, g = jax.value_and_grad(loss_fn)(w_shard)
    n = lax.axis_size("dp")
    return w_shard - 0.1 * g / n, lax.pmean(loss, "dp")


def step_bug_mixed_axes(w_shard, x, y):
    def loss_fn(ws):
        w = lax.all_gather(ws, "dp", tiled=True)
        return jnp.mean((x @ w - y) ** 2)

    loss, g = jax.value_and_grad(loss_fn)(w_shard)
    g = lax.psum(g, ("dp", "tp"))  # BUG: SPMD104
    return w_shard - 0.1 * g, lax.pmean(loss, "dp")


BUGS = {"step_bug_mixed_axes": (IN_SPECS, OUT_SPECS)}
MAIN = "step"


def build(mesh):
    return jax.shard_map(step, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(3), 3)
    raw = (jax.random.normal(k[0], (8, 4)), jax.random.normal(k[1], (4, 8)),
           jax.random.normal(k[2], (4, 4)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
