"""Pipeline parallelism with a GPipe schedule: one layer per stage on the `pp` axis.

Mesh dp=2 x pp=4. Every stage holds one layer's weights (Varying["pp"]); microbatches enter
at stage 0, and each tick every stage applies its layer and `ppermute`s its activation to the
next stage. After `M + 3` ticks the last stage has produced all M microbatch outputs; a
`psum` over pp of the (masked) output buffer makes them Invariant over pp.
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

STAGES = 4
SPECS = (P(None, "dp"), P("pp"))
OUT_SPECS = P(None, "dp")
FORWARD = [(s, s + 1) for s in range(STAGES - 1)]


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((2, STAGES), ("dp", "pp"))


def pipeline(x: Varying["dp"], w: Varying["pp"]) -> Varying["dp"]:
    """x: [microbatches, mb, d] (microbatch rows over dp); w: [1, d, d] this stage's layer."""
    micro = x.shape[0]
    stage = st.axis_index("pp")
    layer = w[0]
    state = st.numpy.zeros_like(x[0])
    outputs = st.numpy.zeros_like(x)

    def tick(t: Invariant, carry: tuple[Any, Any]) -> tuple[Any, Any]:
        state, outputs = carry
        fresh = x[st.numpy.minimum(t, micro - 1)]
        inp = st.numpy.where(stage == 0, fresh, state)
        out = st.numpy.tanh(inp @ layer)
        done = t - (STAGES - 1)                       # microbatch leaving the last stage
        keep = (stage == STAGES - 1) & (done >= 0)
        outputs = outputs.at[st.numpy.maximum(done, 0)].set(
            st.numpy.where(keep, out, outputs[st.numpy.maximum(done, 0)]))
        return st.ppermute(out, "pp", FORWARD), outputs

    _, outputs = st.fori_loop(0, micro + STAGES - 1, tick, (state, outputs))
    last = st.numpy.where(stage == STAGES - 1, outputs, 0.0)
    return st.psum(last, "pp")


def pipeline_raw(x, w):  # type: ignore[no-untyped-def]
    micro = x.shape[0]
    stage = jax.lax.axis_index("pp")
    layer = w[0]
    state = jax.lax.pcast(jnp.zeros_like(x[0]), "pp", to="varying")
    outputs = jax.lax.pcast(jnp.zeros_like(x), "pp", to="varying")

    def tick(t, carry):  # type: ignore[no-untyped-def]
        state, outputs = carry
        fresh = x[jnp.minimum(t, micro - 1)]
        inp = jnp.where(stage == 0, fresh, state)
        out = jnp.tanh(inp @ layer)
        done = t - (STAGES - 1)
        keep = (stage == STAGES - 1) & (done >= 0)
        outputs = outputs.at[jnp.maximum(done, 0)].set(
            jnp.where(keep, out, outputs[jnp.maximum(done, 0)]))
        return jax.lax.ppermute(out, "pp", FORWARD), outputs

    _, outputs = jax.lax.fori_loop(0, micro + STAGES - 1, tick, (state, outputs))
    return jax.lax.psum(jnp.where(stage == STAGES - 1, outputs, 0.0), "pp")


def reference(x, w):  # type: ignore[no-untyped-def]
    h = x
    for s in range(STAGES):
        h = jnp.tanh(h @ w[s])
    return h


def make_inputs(mesh: jax.sharding.Mesh, micro: int = 6, mb: int = 4, d: int = 8):  # type: ignore[no-untyped-def]
    kx, kw = jax.random.split(jax.random.key(5))
    arrays = (jax.random.normal(kx, (micro, mb, d)),
              jax.random.normal(kw, (STAGES, d, d)) / d**0.5)
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, SPECS, strict=False))


def programs(mesh: jax.sharding.Mesh):  # type: ignore[no-untyped-def]
    typed = jax.jit(st.shard_map(pipeline, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    raw = jax.jit(jax.shard_map(pipeline_raw, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    return typed, raw


def run(verbose: bool = False) -> dict[str, float]:
    mesh = make_mesh()
    x, w = make_inputs(mesh)
    typed, raw = programs(mesh)
    out, out_raw = typed(x, w), raw(x, w)
    assert np.array_equal(np.asarray(out), np.asarray(out_raw)), "typed != raw"
    err = float(np.max(np.abs(np.asarray(out) - reference(np.asarray(x), np.asarray(w)))))
    assert err < 1e-4, err
    if verbose:
        print(f"pipeline: {STAGES} stages x {x.shape[0]} microbatches, "
              f"max |typed - reference| = {err:.2e}")
    return {"max_abs_err": err}


if __name__ == "__main__":
    run(verbose=True)
