"""A dp x tp transformer block: RMSNorm, attention with heads over tp, Megatron MLP."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

DH = 2  # head dim
IN_SPECS = (P("dp"), P(), P(None, "tp"), P(None, "tp"), P(None, "tp"), P("tp", None),
            P(None, "tp"), P("tp", None))
OUT_SPECS = P("dp")


def _norm(h, g):
    return h * lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6) * g


def _attention(h, wq, wk, wv):
    b, s, _ = h.shape
    q, k, v = ((h @ w).reshape(b, s, -1, DH) for w in (wq, wk, wv))
    att = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(DH), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, s, -1)


def block(x, g, wq, wk, wv, wo, w1, w2):
    x = x + lax.psum(_attention(_norm(x, g), wq, wk, wv) @ wo, "tp")
    return x + lax.psum(jax.nn.gelu(_norm(x, g) @ w1) @ w2, "tp")


def block_bug_pmean_replicated(x, g, wq, wk, wv, wo, w1, w2):
    x = x - lax.pmean(x, "tp")  # BUG: SPMD103
    x = x + lax.psum(_attention(_norm(x, g), wq, wk, wv) @ wo, "tp")
    return x + lax.psum(jax.nn.gelu(_norm(x, g) @ w1) @ w2, "tp")


def block_bug_cast_twice(x, g, wq, wk, wv, wo, w1, w2):
    x = lax.pcast(x, "dp", to="varying")  # BUG: SPMD301
    x = x + lax.psum(_attention(_norm(x, g), wq, wk, wv) @ wo, "tp")
    return x + lax.psum(jax.nn.gelu(_norm(x, g) @ w1) @ w2, "tp")


BUGS = {"block_bug_pmean_replicated": (IN_SPECS, OUT_SPECS),
        "block_bug_cast_twice": (IN_SPECS, OUT_SPECS)}
MAIN = "block"


def build(mesh):
    return jax.shard_map(block, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(9), 8)
    shapes = [(4, 4, 8), (8,), (8, 8), (8, 8), (8, 8), (8, 8), (8, 16), (16, 8)]
    raw = [0.5 * jax.random.normal(kk, s) for kk, s in zip(k, shapes, strict=True)]
    raw[1] = 1.0 + raw[1]
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
