"""examples/ring_attention.py and examples/zero3.py: typed == raw twin, bit for bit, on 8
simulated devices; the typed versions catch the mistakes their raw twins make silently or with
JAX's own errors."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples import ring_attention, zero3  # noqa: E402


def test_ring_attention_typed_equals_raw_and_reference():
    result = ring_attention.run()
    assert result["max_abs_err"] < 1e-4


def test_zero3_typed_equals_raw_and_reference():
    result = zero3.run(steps=2)
    assert result["max_abs_err"] < 1e-4


def test_ring_attention_raw_loop_needs_the_hand_written_cast():
    """Without the pcast that st.fori_loop inserts, JAX rejects the raw loop."""
    mesh = ring_attention.make_mesh()
    q, k, v = ring_attention.make_inputs(mesh)

    def no_cast(q, k, v):
        def step(i, c):
            m, o = c
            s = jnp.einsum("bqd,bkd->bqk", q, k)
            return jnp.maximum(m, jnp.max(s, axis=-1)), o
        m, o = jax.lax.fori_loop(0, 4, step, (jnp.full(q.shape[:-1], -jnp.inf), jnp.zeros_like(q)))
        return o

    spec = ring_attention.SPEC
    with pytest.raises(TypeError, match="carry input and carry output must have equal types"):
        jax.jit(jax.shard_map(no_cast, mesh=mesh, in_specs=(spec,) * 3, out_specs=spec)).trace(q, k, v)


def test_zero3_states_along_the_step():
    mesh = zero3.make_mesh()
    params, x, y = zero3.make_inputs(mesh)
    seen = {}

    def step(shards, x, y):
        full = {k: st.all_gather(s, "dp", tiled=True, to="reduced") for k, s in shards.items()}
        loss, grads = st.value_and_grad(zero3.loss_fn)(full, x, y)
        seen.update(shard=type(shards["w1"]), full=type(full["w1"]), loss=type(loss),
                    grad=type(grads["w1"]))
        g = {k: st.psum_scatter(v, "dp", tiled=True) for k, v in grads.items()}
        seen["g_shard"] = type(g["w1"])
        # the double reduction that data-parallel code often has: rejected
        with pytest.raises(st.AxisStateError) as e:
            st.psum(st.psum(grads["w1"], "dp"), "dp")
        seen["double"] = e.value.code
        return {k: shards[k] - g[k] for k in shards}

    jax.jit(st.shard_map(step, mesh=mesh, in_specs=(zero3.PARAM_SPECS, zero3.DATA_SPEC,
                                                    zero3.DATA_SPEC),
                         out_specs=zero3.PARAM_SPECS)).trace(params, x, y)
    assert seen == {"shard": st.Varying["dp"], "full": st.Reduced["dp"], "loss": st.Varying["dp"],
                    "grad": st.Unreduced["dp"], "g_shard": st.Varying["dp"], "double": "SPMD103"}


def test_zero3_with_reduced_in_specs():
    """The other way to hold ZeRO parameters: `P(reduced=...)` arguments (Explicit mesh)."""
    mesh = zero3.make_mesh()
    _, x, y = zero3.make_inputs(mesh)
    w = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P(reduced={"dp"})))
    seen = {}

    def step(w, x, y):
        seen["w"] = type(w)
        g = st.grad(lambda w, x, y: st.numpy.mean((x @ w - y) ** 2))(w, x, y)
        seen["g"] = type(g)
        return st.psum_scatter(g, "dp", tiled=True)

    out = jax.jit(st.shard_map(step, mesh=mesh, in_specs=(P(reduced={"dp"}), zero3.DATA_SPEC,
                                                          zero3.DATA_SPEC),
                               out_specs=P("dp")))(w, x, y)
    assert seen == {"w": st.Reduced["dp"], "g": st.Unreduced["dp"]}
    xs, ys = np.asarray(x).reshape(8, 2, 16), np.asarray(y).reshape(8, 2, 8)
    ref = sum(np.asarray(jax.grad(lambda w, a, b: jnp.mean((a @ w - b) ** 2))(jnp.ones((16, 8)), a, b))
              for a, b in zip(xs, ys, strict=False))
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-5)
