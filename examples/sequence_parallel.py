"""Sequence parallelism (Megatron-SP): activations sharded over the sequence on tp.

Mesh dp=2 x tp=4. Between tensor-parallel blocks the activations are sharded over the
sequence (`Varying["dp", "tp"]`); the block gathers the sequence (`all_gather(to="invarying")`:
Invariant over tp), runs a column-parallel then a row-parallel matmul, and `psum_scatter`s the
partial products back to sequence shards: the reduction and the re-sharding in one collective.
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
from spmdtyped import Varying

SPECS = (P("dp", "tp"), P(None, "tp"), P("tp", None))
OUT_SPECS = P("dp", "tp")


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "tp"))


def block(x: Varying["dp", "tp"], w1: Varying["tp"], w2: Varying["tp"]) -> Varying["dp", "tp"]:
    full = st.all_gather(x, "tp", axis=1, tiled=True, to="invarying")   # Varying["dp"]
    h = st.numpy.tanh(full @ w1)                                        # Varying["dp", "tp"]
    partial = st.pcast(h @ w2, "tp", to="unreduced")                    # partial sums over tp
    out = st.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)  # Varying["dp", "tp"]
    return x + out                                                      # residual


def block_raw(x, w1, w2):  # type: ignore[no-untyped-def]
    full = jax.lax.all_gather(x, "tp", axis=1, tiled=True, to="invarying")
    h = jnp.tanh(full @ w1)
    partial = jax.lax.pcast(h @ w2, "tp", to="unreduced")
    return x + jax.lax.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)


def reference(x, w1, w2):  # type: ignore[no-untyped-def]
    return x + jnp.tanh(x @ w1) @ w2


def make_inputs(mesh: jax.sharding.Mesh, batch: int = 4, seq: int = 8, d: int = 16, hidden: int = 32):  # type: ignore[no-untyped-def]
    ks = jax.random.split(jax.random.key(1), 3)
    arrays = (jax.random.normal(ks[0], (batch, seq, d)), jax.random.normal(ks[1], (d, hidden)) / d**0.5,
              jax.random.normal(ks[2], (hidden, d)) / hidden**0.5)
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, SPECS, strict=False))


def programs(mesh: jax.sharding.Mesh):  # type: ignore[no-untyped-def]
    typed = jax.jit(st.shard_map(block, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    raw = jax.jit(jax.shard_map(block_raw, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    return typed, raw


def run(verbose: bool = False) -> dict[str, float]:
    mesh = make_mesh()
    args = make_inputs(mesh)
    typed, raw = programs(mesh)
    out, out_raw = typed(*args), raw(*args)
    assert np.array_equal(np.asarray(out), np.asarray(out_raw)), "typed != raw"
    err = float(np.max(np.abs(np.asarray(out) - reference(*(np.asarray(a) for a in args)))))
    assert err < 1e-4, err
    if verbose:
        print(f"sequence parallel block: output {out.shape}, max |typed - reference| = {err:.2e}")
    return {"max_abs_err": err}


if __name__ == "__main__":
    run(verbose=True)
