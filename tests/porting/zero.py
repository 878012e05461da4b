"""ZeRO-3 with Reduced/Unreduced: parameter shards all_gather'd to a Reduced value, whose
gradient is Unreduced and is reduce-scattered back onto the shards."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IN_SPECS = (P("dp"), P("dp"), P("dp"))
OUT_SPECS = (P("dp"), P())


def step(w_shard, x, y):
    w = lax.all_gather(w_shard, "dp", tiled=True, to="reduced")

    def loss_fn(w):
        return jnp.mean((x @ w - y) ** 2)

    loss, g = jax.value_and_grad(loss_fn)(w)  # g: Unreduced over dp
    g_shard = lax.psum_scatter(g, "dp", tiled=True)
    return w_shard - 0.1 * g_shard, lax.pmean(loss, "dp")


def step_bug_cumsum_unreduced(w_shard, x, y):
    w = lax.all_gather(w_shard, "dp", tiled=True, to="reduced")

    def loss_fn(w):
        return jnp.mean((x @ w - y) ** 2)

    loss, g = jax.value_and_grad(loss_fn)(w)
    g = jnp.cumsum(g, axis=0)  # BUG: SPMD202
    g_shard = lax.psum_scatter(g, "dp", tiled=True)
    return w_shard - 0.1 * g_shard, lax.pmean(loss, "dp")


def step_bug_psum_reduced(w_shard, x, y):
    w = lax.all_gather(w_shard, "dp", tiled=True, to="reduced")
    w = lax.psum(w, "dp")  # BUG: SPMD101
    loss = jnp.mean((x @ w - y) ** 2)
    return w_shard, lax.pmean(loss, "dp")


def step_bug_ppermute_unreduced(w_shard, x, y):
    w = lax.all_gather(w_shard, "dp", tiled=True, to="reduced")
    loss, g = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
    g = lax.ppermute(g, "dp", [(0, 1), (1, 0)])  # BUG: SPMD102
    return w_shard - 0.1 * lax.psum_scatter(g, "dp", tiled=True), lax.pmean(loss, "dp")


BUGS = {n: (IN_SPECS, OUT_SPECS) for n in ("step_bug_cumsum_unreduced", "step_bug_psum_reduced",
                                           "step_bug_ppermute_unreduced")}
MAIN = "step"


def build(mesh):
    return jax.shard_map(step, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(4), 3)
    raw = (jax.random.normal(k[0], (8, 4)), jax.random.normal(k[1], (4, 8)),
           jax.random.normal(k[2], (4, 4)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
