"""Sequence-parallel layer norm with `@jax.jit` helpers called inside the body and the whole
step under `jax.jit` (`from jax import lax` style)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("tp", 4))
IN_SPECS = (P("dp", "tp"), P())
OUT_SPECS = P("dp", "tp")


@jax.jit
def _stats(x):
    n = lax.psum(x.shape[-1], "tp")
    mean = lax.psum(jnp.sum(x, axis=-1, keepdims=True), "tp") / n
    var = lax.psum(jnp.sum((x - mean) ** 2, axis=-1, keepdims=True), "tp") / n
    return mean, var


def layer_norm(x, scale):
    mean, var = _stats(x)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


@jax.jit
def _stats_bug(x):
    n = lax.psum(x.shape[-1], "tp")
    mean = lax.psum(jnp.sum(x, axis=-1, keepdims=True), "tp") / n
    sq = lax.psum(jnp.sum(x ** 2, axis=-1, keepdims=True), "tp") / n
    var = sq - lax.psum(mean ** 2, "tp")  # BUG: SPMD103
    return mean, var


def layer_norm_bug(x, scale):
    mean, var = _stats_bug(x)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * scale


ENTRY, BUGS = "layer_norm", ("layer_norm_bug",)
BUG_LINES = {"layer_norm_bug": "_stats_bug"}


def run(mesh, fn, *args):
    return jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(10), 2)
    return (jax.device_put(jax.random.normal(k[0], (8, 32)), NamedSharding(mesh, P("dp", "tp"))),
            jax.device_put(jax.random.normal(k[1], (8,))[:1], NamedSharding(mesh, P())))
