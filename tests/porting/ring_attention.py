"""Ring attention: queries stay, key/value blocks travel around the tp ring (lax.scan),
with an online softmax."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IN_SPECS = (P("dp", "tp", None), P("dp", "tp", None), P("dp", "tp", None))
OUT_SPECS = P("dp", "tp", None)


def attention(q, k, v):
    n = lax.axis_size("tp")
    perm = [(j, (j + 1) % n) for j in range(n)]
    scale = q.shape[-1] ** -0.5

    def step(carry, _):
        k, v, m, denom, o = carry
        s = jnp.einsum("bqd,bkd->bqk", q, k) * scale
        m_new = jnp.maximum(m, s.max(axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        denom = denom * corr + p.sum(axis=-1)
        o = o * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v)
        k, v = lax.ppermute((k, v), "tp", perm)
        return (k, v, m_new, denom, o), None

    m0 = jnp.full_like(q[..., 0], -jnp.inf)
    init = (k, v, m0, jnp.zeros_like(q[..., 0]), jnp.zeros_like(q))
    (_, _, _, denom, o), _ = lax.scan(step, init, None, length=n)
    return o / denom[..., None]


def attention_bug_axis_typo(q, k, v):
    n = lax.axis_size("tp")
    perm = [(j, (j + 1) % n) for j in range(n)]

    def step(carry, _):
        k, v, o = carry
        p = jax.nn.softmax(jnp.einsum("bqd,bkd->bqk", q, k), axis=-1)
        o = o + jnp.einsum("bqk,bkd->bqd", p, v)
        k, v = lax.ppermute((k, v), "sp", perm)  # BUG: SPMD501
        return (k, v, o), None

    (_, _, o), _ = lax.scan(step, (k, v, jnp.zeros_like(q)), None, length=n)
    return o


BUGS = {"attention_bug_axis_typo": (IN_SPECS, OUT_SPECS)}
MAIN = "attention"


def build(mesh):
    return jax.shard_map(attention, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(6), 3)
    raw = tuple(jax.random.normal(k[i], (2, 8, 4)) for i in range(3))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
