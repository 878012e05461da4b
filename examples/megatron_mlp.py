"""Megatron tensor-parallel MLP: column-parallel W1, row-parallel W2, one psum over tp.

Mesh dp=2 x tp=4 on 8 simulated CPU devices. The batch is sharded over dp; W1's columns and
W2's rows over tp. `x @ w1` is Varying over (dp, tp); the second matmul gives per-device
partial products, which the program declares Unreduced over tp (a free cast) so that nothing
can touch them before `psum` completes the sum: adding the bias first would add it 4 times
(see `broken/megatron_mlp_broken.py`).
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

SPECS = (P("dp"), P(None, "tp"), P("tp"), P("tp", None), P())
OUT_SPECS = P("dp")


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, 4), ("dp", "tp"))


def mlp(x: Varying["dp"], w1: Varying["tp"], b1: Varying["tp"], w2: Varying["tp"],
        b2: st.Invariant) -> Varying["dp"]:
    h = st.numpy.tanh(x @ w1 + b1)          # Varying["dp", "tp"]
    partial = st.pcast(h @ w2, "tp", to="unreduced")   # Typed[Varying["dp"], Unreduced["tp"]]
    return st.psum(partial, "tp") + b2                 # Varying["dp"]


def mlp_raw(x, w1, b1, w2, b2):  # type: ignore[no-untyped-def]
    h = jnp.tanh(x @ w1 + b1)
    partial = jax.lax.pcast(h @ w2, "tp", to="unreduced")
    return jax.lax.psum(partial, "tp") + b2


def reference(x, w1, b1, w2, b2):  # type: ignore[no-untyped-def]
    return jnp.tanh(x @ w1 + b1) @ w2 + b2


def make_inputs(mesh: jax.sharding.Mesh, batch: int = 8, d: int = 16, hidden: int = 32):  # type: ignore[no-untyped-def]
    ks = jax.random.split(jax.random.key(0), 5)
    arrays = (jax.random.normal(ks[0], (batch, d)), jax.random.normal(ks[1], (d, hidden)) / d**0.5,
              jax.random.normal(ks[2], (hidden,)), jax.random.normal(ks[3], (hidden, d)) / hidden**0.5,
              jax.random.normal(ks[4], (d,)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, SPECS, strict=False))


def programs(mesh: jax.sharding.Mesh):  # type: ignore[no-untyped-def]
    """(typed, raw) jitted programs over the same mesh and specs."""
    typed = jax.jit(st.shard_map(mlp, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    raw = jax.jit(jax.shard_map(mlp_raw, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    return typed, raw


def run(verbose: bool = False) -> dict[str, float]:
    mesh = make_mesh()
    args = make_inputs(mesh)
    typed, raw = programs(mesh)
    out, out_raw = typed(*args), raw(*args)
    assert np.array_equal(np.asarray(out), np.asarray(out_raw)), "typed != raw"
    ref = reference(*(np.asarray(a) for a in args))
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=1e-5, atol=1e-5)
    if verbose:
        print(f"megatron MLP: output {out.shape}, max |typed - reference| = "
              f"{float(np.max(np.abs(np.asarray(out) - ref))):.2e}")
    return {"max_abs_err": float(np.max(np.abs(np.asarray(out) - ref)))}


if __name__ == "__main__":
    run(verbose=True)
