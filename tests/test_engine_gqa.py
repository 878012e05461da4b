"""Grouped-query attention under head (tensor) parallelism, as people write it: the query heads
sharded over tp, the key / value heads (fewer: 2 for 8 query heads) passed in replicated, and
`jax.nn.dot_product_attention` (or the `jnp.einsum` it is made of) in the body. Each device
then pairs its query heads with key / value heads 0.. instead of their own group's: JAX runs
it, wrong on every device but the first. The key / value heads meet the sharded query heads in
a contraction's batch dim, where a replicated operand lays the same values along every
device's slice: SPMD215, as it is for an elementwise op (`_rules.refine.einsum`).

- the bug is SPMD215 at the attention's line on `typed_shard_map`, `checking()` and
  `st.shard_map`, for `jax.nn.dot_product_attention` and for the einsum; raw JAX is wrong;
- the right form (this device's key / value group sliced by `axis_index`) equals one device,
  and so do its gradients taken outside the shard_map (the transposed shard_map is checked too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import line_ending_with, on_face
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

B, T, HQ, HKV, D, TP = 2, 8, 8, 2, 4, 4
SPECS = (P("dp", None, "tp"), P("dp"), P("dp"))
OUT = P("dp", None, "tp")
FACES = ["typed_shard_map", "checking", "st.shard_map"]


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, TP), ("dp", "tp"))


def _einsum_attention(q, k, v):
    """`q`: (b, t, heads, d) with heads a multiple of k's; k, v: (b, s, kv heads, d)."""
    b, t, h, d = q.shape
    g = h // k.shape[2]
    q = q.reshape(b, t, k.shape[2], g, d)
    s = jnp.einsum("btkgd,bskd->bkgts", q, k) / np.sqrt(d)  # the einsum's line
    o = jnp.einsum("bkgts,bskd->btkgd", jax.nn.softmax(s, axis=-1), v)
    return o.reshape(b, t, h, d)


ATTENTION = {"dot_product_attention": jax.nn.dot_product_attention,
             "einsum": _einsum_attention}
MARKERS = {"dot_product_attention": "# the attention's line", "einsum": "# the einsum's line"}


def _body(impl, fixed):
    def body(q, k, v):
        if fixed:   # this device's query heads are one group's: its key / value head
            kv = jax.lax.axis_index("tp") * (HQ // TP) // (HQ // HKV)
            k = jax.lax.dynamic_slice_in_dim(k, kv, 1, axis=2)
            v = jax.lax.dynamic_slice_in_dim(v, kv, 1, axis=2)
        return ATTENTION[impl](q, k, v)  # the attention's line
    return body


def _run(face, impl, fixed, mesh, q, k, v):
    body = _body(impl, fixed)

    def hinted(q: Varying["dp", "tp"], k: Varying["dp"], v: Varying["dp"]):
        return body(q, k, v)
    program = on_face(face, body, hinted, mesh=mesh, in_specs=SPECS, out_specs=OUT)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    return program(put(q, SPECS[0]), put(k, SPECS[1]), put(v, SPECS[2]))


def _inputs():
    k = jax.random.split(jax.random.key(80), 3)
    return (jax.random.normal(k[0], (B, T, HQ, D)), jax.random.normal(k[1], (B, T, HKV, D)),
            jax.random.normal(k[2], (B, T, HKV, D)))


def _line(marker):
    return line_ending_with(__file__, marker)


@pytest.mark.parametrize("face", [*FACES, "jax"])
@pytest.mark.parametrize("impl", sorted(ATTENTION))
def test_each_device_attending_its_own_group_equals_one_device(impl, face, mesh):
    q, k, v = _inputs()
    np.testing.assert_allclose(np.asarray(_run(face, impl, True, mesh, q, k, v)),
                               np.asarray(ATTENTION[impl](q, k, v)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("impl", sorted(ATTENTION))
def test_replicated_kv_heads_against_sharded_q_heads_is_spmd215(impl, face, mesh):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, impl, False, mesh, *_inputs())
    assert e.value.code == "SPMD215", str(e.value)
    assert "axis_index('tp')" in e.value.fix
    # JAX's own function is named at the user's call of it; the einsum at its line
    assert (e.value.file, e.value.line) == (__file__, _line(MARKERS[impl])), str(e.value)


@pytest.mark.parametrize("impl", sorted(ATTENTION))
def test_the_gqa_bug_is_real(impl, mesh):
    q, k, v = _inputs()
    got = np.asarray(_run("jax", impl, False, mesh, q, k, v))
    assert not np.allclose(got, np.asarray(ATTENTION[impl](q, k, v)), rtol=1e-3)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking"])
@pytest.mark.parametrize("impl", sorted(ATTENTION))
def test_gradient_taken_outside_the_shard_map_equals_one_device(impl, face, mesh):
    """`jax.grad` around the shard_map: JAX transposes it into a second shard_map whose
    residuals it passes in with specs of its own, which the engine checks too; the right form
    raises nothing there and its gradients equal one device's."""
    q, k, v = _inputs()
    smap = st.adapters.typed_shard_map if face == "typed_shard_map" else jax.shard_map
    inner = smap(_body(impl, True), mesh=mesh, in_specs=SPECS, out_specs=OUT)
    step = jax.jit(jax.grad(lambda q, k, v: jnp.sum(inner(q, k, v) ** 2), argnums=(0, 1, 2)))
    if face == "checking":
        step = st.adapters.checking(step)
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    got = step(put(q, SPECS[0]), put(k, SPECS[1]), put(v, SPECS[2]))
    want = jax.grad(lambda q, k, v: jnp.sum(ATTENTION[impl](q, k, v) ** 2),
                    argnums=(0, 1, 2))(q, k, v)
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4)
