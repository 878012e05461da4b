"""Causal ring attention written for check_vma=False (tests/test_migrate_vma_suites.py migrates
it): a jax.custom_vjp whose forward and backward pass k / v (and their gradients) around the
ring with ppermute in a lax.scan, and skip the blocks above the diagonal with a lax.cond; its
outputs and its gradients (taken outside the shard_map and inside) are computed at import."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

mesh = jax.make_mesh((4,), ("sp",))
N, C, D = 4, 8, 16          # ring size, block length, head dim
SCALE = D ** -0.5
PERM = [(j, (j + 1) % N) for j in range(N)]
spec = NamedSharding(mesh, P("sp"))
key = jax.random.split(jax.random.key(7), 4)
q = jax.device_put(jax.random.normal(key[0], (N * C, D)), spec)
k = jax.device_put(jax.random.normal(key[1], (N * C, D)), spec)
v = jax.device_put(jax.random.normal(key[2], (N * C, D)), spec)
w = jax.device_put(jax.random.normal(key[3], (N * C, D)), spec)


def _scores(q, k, src, idx):
    s = q @ k.T * SCALE
    causal = (src < idx) | (jnp.arange(C)[:, None] >= jnp.arange(C)[None, :])
    return jnp.where(causal, s, -jnp.inf)


def _forward(q, k, v):
    idx = jax.lax.axis_index("sp")

    def step(carry, t):
        o, m, lsum, k, v = carry
        src = (idx - t) % N          # the block k and v hold at step t

        def block():
            s = _scores(q, k, src, idx)
            bm = s.max(axis=-1)
            p = jnp.exp(s - bm[:, None])
            return p @ v, bm, p.sum(axis=-1)

        bo, bm, bl = jax.lax.cond(
            src > idx, lambda: (jnp.zeros((C, D)), jnp.full((C,), -jnp.inf), jnp.zeros((C,))),
            block)
        m_new = jnp.maximum(m, bm)
        a, b = jnp.exp(m - m_new), jnp.exp(bm - m_new)
        o = o * a[:, None] + bo * b[:, None]
        lsum = lsum * a + bl * b
        k = jax.lax.ppermute(k, "sp", PERM)
        v = jax.lax.ppermute(v, "sp", PERM)
        return (o, m_new, lsum, k, v), None

    init = (jnp.zeros((C, D)), jnp.full((C,), -jnp.inf), jnp.zeros((C,)), k, v)
    (o, m, lsum, _, _), _ = jax.lax.scan(step, init, jnp.arange(N))
    return o / lsum[:, None], m + jnp.log(lsum)


@jax.custom_vjp
def ring_attention(q, k, v):
    return _forward(q, k, v)[0]


def ring_attention_fwd(q, k, v):
    o, lse = _forward(q, k, v)
    return o, (q, k, v, o, lse)


def ring_attention_bwd(res, do):
    q, k, v, o, lse = res
    idx = jax.lax.axis_index("sp")
    delta = jnp.sum(do * o, axis=-1)

    def step(carry, t):
        dq, dk, dv, k, v = carry
        src = (idx - t) % N

        def block():
            p = jnp.exp(_scores(q, k, src, idx) - lse[:, None])
            ds = p * (do @ v.T - delta[:, None]) * SCALE
            return ds @ k, ds.T @ q, p.T @ do

        bq, bk, bv = jax.lax.cond(
            src > idx, lambda: (jnp.zeros((C, D)), jnp.zeros((C, D)), jnp.zeros((C, D))), block)
        # dk and dv travel with the k and v blocks they belong to: home after N steps
        k, v, dk, dv = (jax.lax.ppermute(a, "sp", PERM) for a in (k, v, dk + bk, dv + bv))
        return (dq + bq, dk, dv, k, v), None

    init = (jnp.zeros((C, D)), jnp.zeros((C, D)), jnp.zeros((C, D)), k, v)
    (dq, dk, dv, _, _), _ = jax.lax.scan(step, init, jnp.arange(N))
    return dq, dk, dv


ring_attention.defvjp(ring_attention_fwd, ring_attention_bwd)

attention = jax.shard_map(ring_attention, mesh=mesh, in_specs=(P("sp"),) * 3, out_specs=P("sp"),
                          check_vma=False)


def local_grads(q, k, v, w):
    # the gradient taken inside the shard_map, of this device's part of the loss
    return jax.grad(lambda q, k, v: jnp.sum(ring_attention(q, k, v) * w), argnums=(0, 1, 2))(
        q, k, v)


grads_inside = jax.shard_map(local_grads, mesh=mesh, in_specs=(P("sp"),) * 4,
                             out_specs=(P("sp"),) * 3, check_vma=False)


def loss(q, k, v, w):
    return jnp.sum(attention(q, k, v) * w)


OUT = attention(q, k, v)
with jax.set_mesh(mesh):
    GRADS_OUTSIDE = jax.grad(loss, argnums=(0, 1, 2))(q, k, v, w)
GRADS_INSIDE = grads_inside(q, k, v, w)
