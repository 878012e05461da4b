"""Gradient accumulation over microbatches with `jax.lax.scan`; tensor-parallel matmul with a
`jax.lax.psum` inside the scan body."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("tp", 4))
IN_SPECS = (P(None, "tp"), P("tp", None), P(None, "dp"))
OUT_SPECS = (P(None, "tp"), P("tp", None), P())


def accumulate(w1, w2, xs):
    def loss_fn(w1, w2, x):
        return jax.lax.pmean(jnp.mean(jax.lax.psum(jnp.tanh(x @ w1) @ w2, "tp") ** 2), "dp")

    def body(carry, x):
        g1, g2, total = carry
        loss, (d1, d2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2, x)
        return (g1 + d1, g2 + d2, total + loss), None

    init = (jnp.zeros_like(w1), jnp.zeros_like(w2), jnp.zeros(()))
    (g1, g2, total), _ = jax.lax.scan(body, init, xs)
    return g1, g2, total


def accumulate_bug(w1, w2, xs):
    def loss_fn(w1, w2, x):
        return jax.lax.pmean(jnp.mean(jax.lax.psum(jnp.tanh(x @ w1) @ w2, "tp") ** 2), "dp")

    def body(carry, x):
        g1, g2, total = carry
        loss, (d1, d2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2, x)
        return (g1 + d1, g2 + d2, total + loss), None

    init = (jnp.zeros_like(w1), jnp.zeros_like(w2), jnp.zeros(()))
    (g1, g2, total), _ = jax.lax.scan(body, init, xs)
    return g1, g2, jax.lax.psum(total, "tp")  # BUG: SPMD103


ENTRY, BUGS = "accumulate", ("accumulate_bug",)


def run(mesh, fn, *args):
    return jax.shard_map(fn, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(7), 3)
    raw = (0.1 * jax.random.normal(k[0], (8, 16)), 0.1 * jax.random.normal(k[1], (16, 8)),
           jax.random.normal(k[2], (3, 8, 8)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
