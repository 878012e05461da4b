"""Collective matmul: an all-gather matmul as a ppermute ring, overlapping compute and transfer.

Mesh tp=8. `x` is sharded over rows, `w` over columns. Instead of all-gathering `x` and then
multiplying, each of the 8 steps multiplies the row block it holds with the local columns
and passes the block to its neighbour (`ppermute`), inside `st.fori_loop`. The output buffer
starts Invariant (zeros) and becomes Varying["tp"] in the loop: `st.fori_loop` casts the
initial carry for you (raw JAX needs a hand-written `pcast`).
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying

N = 8
SPECS = (P("tp"), P(None, "tp"))
OUT_SPECS = P(None, "tp")
RING = [(j, (j - 1) % N) for j in range(N)]   # device j sends its block to device j - 1


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((N,), ("tp",))


def matmul(x: Varying["tp"], w: Varying["tp"]) -> Varying["tp"]:
    me = st.axis_index("tp")
    out = st.numpy.zeros((N, x.shape[0], w.shape[1]), dtype=x.dtype)

    def body(i: Invariant, carry: tuple[Varying["tp"], Any]) -> tuple[Varying["tp"], Any]:
        block, out = carry
        src = (me + i) % N                       # whose rows `block` holds at step i
        out = out.at[src].set(block @ w)
        return st.ppermute(block, "tp", RING), out

    _, out = st.fori_loop(0, N, body, (x, out))
    return out.reshape(N * x.shape[0], w.shape[1])


def matmul_raw(x, w):  # type: ignore[no-untyped-def]
    me = jax.lax.axis_index("tp")
    out = jax.lax.pcast(jnp.zeros((N, x.shape[0], w.shape[1]), dtype=x.dtype), "tp", to="varying")

    def body(i, carry):  # type: ignore[no-untyped-def]
        block, out = carry
        src = (me + i) % N
        out = out.at[src].set(block @ w)
        return jax.lax.ppermute(block, "tp", RING), out

    _, out = jax.lax.fori_loop(0, N, body, (x, out))
    return out.reshape(N * x.shape[0], w.shape[1])


def make_inputs(mesh: jax.sharding.Mesh, m: int = 32, k: int = 16, n: int = 64):  # type: ignore[no-untyped-def]
    kx, kw = jax.random.split(jax.random.key(4))
    arrays = (jax.random.normal(kx, (m, k)), jax.random.normal(kw, (k, n)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, SPECS, strict=False))


def programs(mesh: jax.sharding.Mesh):  # type: ignore[no-untyped-def]
    typed = jax.jit(st.shard_map(matmul, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    raw = jax.jit(jax.shard_map(matmul_raw, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    return typed, raw


def run(verbose: bool = False) -> dict[str, float]:
    mesh = make_mesh()
    x, w = make_inputs(mesh)
    typed, raw = programs(mesh)
    out, out_raw = typed(x, w), raw(x, w)
    assert np.array_equal(np.asarray(out), np.asarray(out_raw)), "typed != raw"
    err = float(np.max(np.abs(np.asarray(out) - np.asarray(x) @ np.asarray(w))))
    assert err < 1e-4, err
    if verbose:
        print(f"collective matmul: {x.shape} @ {w.shape} over an {N}-device ring, "
              f"max |typed - reference| = {err:.2e}")
    return {"max_abs_err": err}


if __name__ == "__main__":
    run(verbose=True)
