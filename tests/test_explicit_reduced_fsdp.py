"""FSDP with Reduced weights and Unreduced gradients, as MaxText's DeepSeek batch-split model
writes it (explicit sharding, a data x fsdp x expert mesh): the weights are cast to Reduced
over the axes they are replicated on (`pcast(..., to="reduced")`) and all-gathered over fsdp
to Reduced (`all_gather(..., to="reduced")`) in one shard_map behind an
`optimization_barrier`; the weight gradients, contracted over a batch sharded over all three
axes into Unreduced values (`einsum(..., out_sharding=P(unreduced=...))`), are
reduce-scattered over fsdp and all-reduced over expert in another.

Under `jax.shard_map`, `typed_shard_map` and `checking(step)` the loss and the reduced
gradients equal one device's; the mistakes JAX refuses at its out_specs (a weight not cast to
Reduced over data, a gather to Varying, the all-reduce over expert forgotten) are SPMD401 with
the output's path, of JAX's class (ValueError). Not a `tests/production` pattern: its
gradient is written by hand (JAX's autodiff does not transpose these explicit-sharding einsums
with Reduced weights: "out_sharding's unreduced axes should be equal to the contracting specs",
raw as typed), so the module has no `jax.grad` step to port.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped.adapters import checking, typed_shard_map

ALL = ("data", "fsdp", "expert")
R3 = set(ALL)
FACES = ("raw", "typed_shard_map", "checking")


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 2, 2), ALL, axis_types=(AxisType.Explicit,) * 3)


def _smap(face):
    return typed_shard_map if face == "typed_shard_map" else jax.shard_map


def gather_weights(smap, mesh, weights, *, cast_data=True, to="reduced"):
    def fn(weights):
        norm, wq, wo = weights
        if cast_data:
            wq = jax.lax.pcast(wq, axis_name="data", to="reduced")
        wo = jax.lax.pcast(wo, axis_name="data", to="reduced")
        wq = jax.lax.pcast(wq, axis_name="expert", to="reduced")
        wo = jax.lax.pcast(wo, axis_name="expert", to="reduced")
        wq = jax.lax.all_gather(wq, axis_name="fsdp", tiled=True, to=to)
        wo = jax.lax.all_gather(wo, axis_name="fsdp", tiled=True, axis=1, to="reduced")
        return norm, wq, wo

    return jax.lax.optimization_barrier(smap(
        fn, mesh=mesh, in_specs=((P(None), P("fsdp", None), P(None, "fsdp")),),
        out_specs=(P(None), P(None, None, reduced=R3), P(None, None, reduced=R3)))(weights))


def reduce_scatter(smap, mesh, g_wq, g_wo, *, all_reduce_wo=True):
    def fn(g_wq, g_wo):
        g_wq = jax.lax.psum_scatter(g_wq, axis_name="fsdp", tiled=True)
        g_wo = jax.lax.psum_scatter(g_wo, axis_name="fsdp", tiled=True, scatter_dimension=1)
        g_wq = jax.lax.psum(g_wq, axis_name="expert")
        if all_reduce_wo:
            g_wo = jax.lax.psum(g_wo, axis_name="expert")
        return g_wq, g_wo

    return smap(fn, mesh=mesh,
                in_specs=(P(None, None, unreduced=R3), P(None, None, unreduced=R3)),
                out_specs=(P("fsdp", None, unreduced={"data"}),
                           P(None, "fsdp", unreduced={"data"})))(g_wq, g_wo)


def _inputs(mesh):
    rng = np.random.default_rng(0)
    raw = {"norm": rng.standard_normal(8), "wq": rng.standard_normal((8, 16)) / 3,
           "wo": rng.standard_normal((16, 8)) / 4, "x": rng.standard_normal((16, 8)),
           "dh": rng.standard_normal((16, 16))}
    specs = {"norm": P(None), "wq": P("fsdp", None), "wo": P(None, "fsdp"),
             "x": P(ALL, None), "dh": P(ALL, None)}
    placed = {k: jax.device_put(jnp.asarray(v, jnp.float32), NamedSharding(mesh, specs[k]))
              for k, v in raw.items()}
    return {k: np.asarray(v, np.float32) for k, v in raw.items()}, placed


def _run(face, mesh, step, *args):
    fn = checking(jax.jit(step)) if face == "checking" else jax.jit(step)
    with jax.set_mesh(mesh):
        return fn(*args)


@pytest.mark.parametrize("face", FACES)
def test_the_gathered_weights_give_one_devices_loss(face, mesh):
    ref, a = _inputs(mesh)

    def loss(norm, wq, wo, x):
        norm, wq, wo = gather_weights(_smap(face), mesh, (norm, wq, wo))
        return jnp.mean(jnp.tanh((x * norm) @ wq) @ wo)

    got = _run(face, mesh, loss, a["norm"], a["wq"], a["wo"], a["x"])
    want = np.mean(np.tanh((ref["x"] * ref["norm"]) @ ref["wq"]) @ ref["wo"])
    np.testing.assert_allclose(float(got), want, rtol=1e-5)


@pytest.mark.parametrize("face", FACES)
def test_the_unreduced_gradients_reduce_scatter_to_one_devices(face, mesh):
    ref, a = _inputs(mesh)

    def grads(x, dh):
        # the weight gradients of a batch-split backward pass: contracted over the batch,
        # sharded over every axis, into values Unreduced over all three
        g_wq = jnp.einsum("bd,bf->df", x, dh, out_sharding=P(None, None, unreduced=R3))
        g_wo = jnp.einsum("bf,bd->fd", dh, x, out_sharding=P(None, None, unreduced=R3))
        g_wq, g_wo = reduce_scatter(_smap(face), mesh, g_wq, g_wo)
        return (jax.sharding.reshard(g_wq, P("fsdp", None)),    # the all-reduce over data
                jax.sharding.reshard(g_wo, P(None, "fsdp")))

    g_wq, g_wo = _run(face, mesh, grads, a["x"], a["dh"])
    np.testing.assert_allclose(np.asarray(g_wq), ref["x"].T @ ref["dh"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(g_wo), ref["dh"].T @ ref["x"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("mistake,axis", [
    ("a weight not cast to Reduced over data", "data"),
    ("a gather to Varying", "fsdp"),
    ("the all-reduce over expert forgotten", "expert"),
])
def test_a_mistake_jax_refuses_is_spmd401_at_its_output(face, mistake, axis, mesh):
    """Each mistake is in the second output (`wq`, or `g_wo`): its path is named."""
    _, a = _inputs(mesh)
    smap = _smap(face)
    if mistake == "the all-reduce over expert forgotten":
        def step(x, dh):
            g = jnp.einsum("bd,bf->df", x, dh, out_sharding=P(None, None, unreduced=R3))
            return reduce_scatter(smap, mesh, g, g.T, all_reduce_wo=False)
        args = (a["x"], a["dh"])
    else:
        kw = {"cast_data": False} if axis == "data" else {"to": "varying"}

        def step(norm, wq, wo):
            return gather_weights(smap, mesh, (norm, wq, wo), **kw)
        args = (a["norm"], a["wq"], a["wo"])
    with pytest.raises(ValueError) as got:   # JAX's class, on every face
        _run(face, mesh, step, *args)
    if face != "raw":
        err = got.value
        assert isinstance(err, st.SpmdTypeError) and err.code == "SPMD401", err
        assert f"on axis '{axis}'" in err.headline and "(output 1: out[1])" in err.headline, \
            err.headline
