"""Sequence parallelism: layernorm on sequence shards, all_gather -> MLP -> psum_scatter."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IN_SPECS = (P("dp", "tp", None), P(), P(None, "tp"), P("tp", None))
OUT_SPECS = P("dp", "tp", None)


def _norm(x, g):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * lax.rsqrt(var + 1e-5) * g


def block(x, g, w1, w2):
    xa = lax.all_gather(_norm(x, g), "tp", axis=1, tiled=True)  # the full sequence
    h = jax.nn.relu(xa @ w1)
    return x + lax.psum_scatter(h @ w2, "tp", scatter_dimension=1, tiled=True)


def block_bug_gather_replicated(x, g, w1, w2):
    g_full = lax.all_gather(g, "tp", tiled=True)  # BUG: SPMD103
    xa = lax.all_gather(_norm(x, g_full[: x.shape[-1]]), "tp", axis=1, tiled=True)
    h = jax.nn.relu(xa @ w1)
    return x + lax.psum_scatter(h @ w2, "tp", scatter_dimension=1, tiled=True)


BUGS = {"block_bug_gather_replicated": (IN_SPECS, OUT_SPECS)}
MAIN = "block"


def build(mesh):
    return jax.shard_map(block, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(2), 4)
    raw = (jax.random.normal(k[0], (4, 8, 8)), 1.0 + 0.1 * jax.random.normal(k[1], (8,)),
           jax.random.normal(k[2], (8, 16)), jax.random.normal(k[3], (16, 8)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
