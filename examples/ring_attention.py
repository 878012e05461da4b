"""Ring attention: the sequence is sharded over `sp`, key/value blocks travel around the ring.

Mesh dp=2 x sp=4. Queries, keys and values are `Varying["dp", "sp"]` (batch over dp, sequence
over sp). Each of the `sp` steps of an `st.fori_loop` attends the local queries to the key/value
block currently held, folds it into an online softmax (running max `m`, normaliser `den`, output
`o`), and passes the block to the next device with `st.ppermute`.

The running max and normaliser start as Invariant constants (`-inf`, `0`) but the body makes
them Varying: `st.fori_loop` casts the initial carry for free (`pvary`) and retraces, where
`jax.lax.fori_loop` fails with "carry input and carry output must have equal types" until the
hand-written `pcast` of the raw twin below is added.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.numpy as snp
from spmdtyped import Varying

SPEC = P("dp", "sp", None)   # (batch, sequence, head dim)


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "sp"))


def ring_attention(q: Varying["dp", "sp"], k: Varying["dp", "sp"],
                   v: Varying["dp", "sp"]) -> Varying["dp", "sp"]:
    n = st.axis_size("sp")
    perm = [(j, (j + 1) % n) for j in range(n)]
    scale: float = 1.0 / q.shape[-1] ** 0.5

    def step(i: Varying["dp", "sp"], carry: tuple[Varying["dp", "sp"], ...]) -> tuple[Varying["dp", "sp"], ...]:
        k_blk, v_blk, m, den, o = carry
        s = snp.einsum("bqd,bkd->bqk", q, k_blk) * scale                  # Varying["dp", "sp"]
        m_new = snp.maximum(m, snp.max(s, axis=-1))
        p = snp.exp(s - m_new[..., None])
        corr = snp.exp(m - m_new)
        den = den * corr + p.sum(axis=-1)
        o = o * corr[..., None] + snp.einsum("bqk,bkd->bqd", p, v_blk)
        k_blk = st.ppermute(k_blk, "sp", perm)                             # next block
        v_blk = st.ppermute(v_blk, "sp", perm)
        return k_blk, v_blk, m_new, den, o

    m0 = snp.full(q.shape[:-1], -jnp.inf)       # Invariant: pvary'd by st.fori_loop
    den0 = snp.zeros(q.shape[:-1])                # Invariant: pvary'd by st.fori_loop
    o0 = snp.zeros_like(q)                      # Varying["dp", "sp"], like q
    _, _, _, den, o = st.fori_loop(0, n, step, (k, v, m0, den0, o0))
    return o / den[..., None]


def ring_attention_raw(q, k, v):  # type: ignore[no-untyped-def]
    n = jax.lax.axis_size("sp")
    perm = [(j, (j + 1) % n) for j in range(n)]
    scale: float = 1.0 / q.shape[-1] ** 0.5

    def step(i, carry):  # type: ignore[no-untyped-def]
        k_blk, v_blk, m, den, o = carry
        s = jnp.einsum("bqd,bkd->bqk", q, k_blk) * scale
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        p = jnp.exp(s - m_new[..., None])
        corr = jnp.exp(m - m_new)
        den = den * corr + p.sum(axis=-1)
        o = o * corr[..., None] + jnp.einsum("bqk,bkd->bqd", p, v_blk)
        k_blk = jax.lax.ppermute(k_blk, "sp", perm)
        v_blk = jax.lax.ppermute(v_blk, "sp", perm)
        return k_blk, v_blk, m_new, den, o

    # the casts st.fori_loop inserts for you
    m0 = jax.lax.pcast(jnp.full(q.shape[:-1], -jnp.inf), ("dp", "sp"), to="varying")
    den0 = jax.lax.pcast(jnp.zeros(q.shape[:-1]), ("dp", "sp"), to="varying")
    o0 = jnp.zeros_like(q)
    _, _, _, den, o = jax.lax.fori_loop(0, n, step, (k, v, m0, den0, o0))
    return o / den[..., None]


def reference(q, k, v):  # type: ignore[no-untyped-def]
    s = jnp.einsum("bqd,bkd->bqk", q, k) / q.shape[-1] ** 0.5
    return jnp.einsum("bqk,bkd->bqd", jax.nn.softmax(s, axis=-1), v)


def make_inputs(mesh: jax.sharding.Mesh, batch: int = 2, seq: int = 16, d: int = 8):  # type: ignore[no-untyped-def]
    ks = jax.random.split(jax.random.key(0), 3)
    return tuple(jax.device_put(jax.random.normal(kk, (batch, seq, d)), NamedSharding(mesh, SPEC))
                 for kk in ks)


def programs(mesh: jax.sharding.Mesh):  # type: ignore[no-untyped-def]
    """(typed, raw): the same ring attention through st.shard_map and jax.shard_map."""
    typed = jax.jit(st.shard_map(ring_attention, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC))
    raw = jax.jit(jax.shard_map(ring_attention_raw, mesh=mesh, in_specs=(SPEC,) * 3, out_specs=SPEC))
    return typed, raw


def run(verbose: bool = False) -> dict[str, float]:
    mesh = make_mesh()
    q, k, v = make_inputs(mesh)
    typed, raw = programs(mesh)
    out, out_raw = typed(q, k, v), raw(q, k, v)
    assert np.array_equal(np.asarray(out), np.asarray(out_raw)), "typed != raw"
    ref = reference(*(np.asarray(a) for a in (q, k, v)))    # one device, unsharded
    err = float(np.max(np.abs(np.asarray(out) - np.asarray(ref))))
    assert err < 1e-4, err
    if verbose:
        print(f"ring attention: output {out.shape}, typed == raw bit for bit, "
              f"max |typed - reference| = {err:.2e}")
    return {"max_abs_err": err}


if __name__ == "__main__":
    run(verbose=True)
