"""Gradients read from the jaxpr in equinox code (issue 27, item 2): `eqx.filter_grad` /
`eqx.filter_value_and_grad` of an equinox module inside a raw `jax.shard_map` body are found
by the engine like `jax.grad`'s, under `typed_shard_map`, `st.adapters.checking(step)` and
`infer` alike:

- an expert-parallel layer whose experts' gradients are psum'd over the expert axis too
  (SPMD108: it sums different experts' gradients), and its fix, equal to one device's gradient;
- per-example gradients, `jax.vmap(eqx.filter_grad(loss))` of a replicated module on a loss
  that differs per device (SPMD407 at the `jax.vmap` line: JAX sums each example's gradient
  over the devices), and the batch sum taken right away, equal to one device's gradient.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

E, D, F, T = 8, 3, 2, 16          # experts, model dim, expert dim, tokens


class Experts(eqx.Module):
    w: jax.Array                  # (E, D, F): each device holds E / |ep| experts

    def __call__(self, x):
        return jnp.einsum("td,edf->tef", x, self.w)


def loss_of(model, x):
    return 0.5 * jnp.sum(model(x) ** 2)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "ep"), axis_types=(AxisType.Explicit,) * 2)


def _inputs(mesh):
    w = jnp.linspace(-1.0, 1.0, E * D * F).reshape(E, D, F)
    x = jnp.linspace(-0.5, 0.7, T * D).reshape(T, D)
    model = Experts(jax.device_put(w, NamedSharding(mesh, P("ep"))))
    return model, jax.device_put(x, NamedSharding(mesh, P("dp"))), Experts(w), x


def expert_grads_buggy(model, x):
    local = jax.tree.map(lambda a: jax.lax.pcast(a, "dp", to="varying"), model)
    g = eqx.filter_grad(loss_of)(local, x)
    return jax.tree.map(lambda a: jax.lax.psum(a, ("dp", "ep")), g)  # BUG: sums other experts'


def expert_grads_fixed(model, x):
    local = jax.tree.map(lambda a: jax.lax.pcast(a, "dp", to="varying"), model)
    g = eqx.filter_grad(loss_of)(local, x)
    return jax.tree.map(lambda a: jax.lax.psum(a, "dp"), g)   # each device's experts, all tokens


BUG_LINE = expert_grads_buggy.__code__.co_firstlineno + 3
SPECS = dict(in_specs=(Experts(P("ep")), P("dp")), out_specs=Experts(P("ep")))


def _run(face, body, mesh, *args):
    if face == "typed_shard_map":
        return jax.jit(st.adapters.typed_shard_map(body, mesh=mesh, **SPECS))(*args)
    if face == "checking":
        return st.adapters.checking(jax.jit(jax.shard_map(body, mesh=mesh, **SPECS)))(*args)
    rep = st.adapters.infer(body, *args, mesh=mesh, **SPECS)
    if rep.violations:
        raise rep.violations[0]
    return jax.jit(jax.shard_map(body, mesh=mesh, **SPECS))(*args)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "infer"])
def test_expert_gradients_psummed_over_the_expert_axis_are_spmd108(face, mesh):
    model, x, _, _ = _inputs(mesh)
    with pytest.raises(st.SpmdTypeError) as ei:
        _run(face, expert_grads_buggy, mesh, model, x)
    assert (ei.value.code, ei.value.line) == ("SPMD108", BUG_LINE), str(ei.value)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking", "infer"])
def test_expert_gradients_fixed_equal_one_device(face, mesh):
    model, x, model1, x1 = _inputs(mesh)
    got = _run(face, expert_grads_fixed, mesh, model, x)
    want = eqx.filter_grad(loss_of)(model1, x1)
    np.testing.assert_allclose(np.asarray(got.w), np.asarray(want.w), rtol=1e-5, atol=1e-6)
    # the bug is real: its numbers are not one device's gradient
    wrong = jax.jit(jax.shard_map(expert_grads_buggy, mesh=mesh, **SPECS))(model, x)
    assert not np.allclose(np.asarray(wrong.w), np.asarray(want.w), rtol=1e-3)


class Net(eqx.Module):
    p: jax.Array

    def __call__(self, x):
        return jnp.sin(jnp.dot(self.p, x))


def per_example_grads(net, xs):
    return jax.vmap(eqx.filter_grad(lambda m, x: m(x)), in_axes=(None, 0))(net, xs)  # BUG


def batch_grad(net, xs):   # summed over the batch right away: JAX's sum over devices is right
    g = jax.vmap(eqx.filter_grad(lambda m, x: m(x)), in_axes=(None, 0))(net, xs)
    return jax.tree.map(lambda a: a.sum(0), g)


@pytest.mark.parametrize("face", ["typed_shard_map", "checking"])
def test_per_example_gradients_of_an_equinox_module_are_spmd407(face):
    mesh = jax.make_mesh((8,), ("dp",), axis_types=(AxisType.Auto,))
    net = Net(jnp.linspace(0.1, 0.8, 3))
    xs = jnp.linspace(-1, 1, 48).reshape(16, 3)
    specs = dict(mesh=mesh, in_specs=(Net(P()), P("dp")))
    with pytest.raises(st.SpmdTypeError) as ei:
        if face == "typed_shard_map":
            jax.jit(st.adapters.typed_shard_map(per_example_grads, out_specs=Net(P("dp")),
                                                **specs))(net, xs)
        else:
            st.adapters.checking(jax.jit(jax.shard_map(per_example_grads, out_specs=Net(P("dp")),
                                                       **specs)))(net, xs)
    assert ei.value.code == "SPMD407", str(ei.value)
    assert ei.value.line == per_example_grads.__code__.co_firstlineno + 1
    got = jax.jit(st.adapters.typed_shard_map(batch_grad, out_specs=Net(P()), **specs))(net, xs)
    want = eqx.filter_grad(lambda m: jnp.sum(jax.vmap(m)(xs)))(net)
    np.testing.assert_allclose(np.asarray(got.p), np.asarray(want.p), rtol=1e-5)
