"""`jax.grad` / `jax.value_and_grad` / `eqx.filter_grad` / `eqx.filter_value_and_grad` of a
function returning a *typed* loss, inside `st.shard_map` on a dp x tp mesh (issue 14).

They are `st.value_and_grad`'s: the same numbers, states and refinements, the same loss
checks (SPMD405, SPMD407), and equal to a single-device reference of the gradient. Calls
without typed values stay JAX's own.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import put
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped._typed import array as _array

SPECS = (P(None, "tp"), P("tp", None), P())      # w1 column-, w2 row-parallel, b replicated
TOL = {"rtol": 2e-5, "atol": 2e-6}


def _params():
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    return (jax.random.normal(k1, (6, 8)) / 3, jax.random.normal(k2, (8, 5)) / 3,
            jax.random.normal(k3, (5,)))


def _data():
    return jax.random.normal(jax.random.key(1), (8, 6))


def _typed_loss(params, x):
    """Megatron MLP, mean squared output: Invariant (psum over tp, pmean over dp)."""
    w1, w2, b = params
    y = st.psum(jnp.tanh(x @ w1) @ w2, "tp") + b     # Varying["dp"]
    return st.pmean(jnp.mean(y ** 2), "dp")          # a typed Invariant scalar


def _reference_loss(params, x):
    w1, w2, b = params
    return jnp.mean((jnp.tanh(x @ w1) @ w2 + b) ** 2)


def _value_and_grads(how):
    """(value or None, grads) of `_typed_loss` by the differentiation function `how`."""
    def run(params, x):
        loss = lambda p: _typed_loss(p, x)  # noqa: E731
        if how == "jax.grad":
            return None, jax.grad(loss)(params)
        if how == "jax.value_and_grad":
            return jax.value_and_grad(loss)(params)
        if how == "eqx.filter_grad":
            return None, eqx.filter_grad(loss)(params)
        if how == "eqx.filter_value_and_grad":
            return eqx.filter_value_and_grad(loss)(params)
        if how == "st.grad":
            return None, st.grad(loss)(params)
        return st.value_and_grad(loss)(params)
    return run


HOWS = ["jax.grad", "jax.value_and_grad", "eqx.filter_grad", "eqx.filter_value_and_grad",
        "st.grad", "st.value_and_grad"]


def _describe(tree):
    """State and refinement of each typed leaf (`Shard['tp', -1]`, `Invariant`)."""
    return [repr(leaf).split("(local")[0] for leaf in jax.tree.leaves(tree, is_leaf=_array.is_typed)]


def _states(tree):
    return [st.typeof(leaf) for leaf in jax.tree.leaves(tree, is_leaf=_array.is_typed)]


def _run(mesh, how, seen):
    def body(params, x):
        value, grads = _value_and_grads(how)(params, x)
        seen[how] = (_describe(grads), None if value is None else _describe(value),
                     _states(grads))
        return (grads, value if value is not None else jnp.zeros(()))

    f = st.shard_map(body, mesh=mesh, in_specs=(SPECS, P("dp")), out_specs=(SPECS, P()))
    params = tuple(put(mesh, p, s) for p, s in zip(_params(), SPECS, strict=True))
    return jax.jit(f)(params, put(mesh, _data(), P("dp")))


@pytest.mark.parametrize("how", HOWS)
def test_gradient_of_a_typed_loss_equals_st_grad_and_the_reference(mesh_dp_tp, how):
    seen = {}
    grads, value = _run(mesh_dp_tp, how, seen)
    st_grads, _ = _run(mesh_dp_tp, "st.grad", seen)
    ref_value, ref_grads = jax.value_and_grad(_reference_loss)(_params(), _data())
    for g, s, r in zip(grads, st_grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(s), rtol=0, atol=0)
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), **TOL)
    if "value" in how:
        np.testing.assert_allclose(float(value), float(ref_value), **TOL)
        assert seen[how][1] == ["Invariant"]   # the loss comes back typed
    # the states of st.grad's gradients: w1, w2 Varying over tp (Shards of the global
    # gradient), b Invariant (summed over dp and tp)
    assert seen[how][2] == seen["st.grad"][2] == [st.SpmdType(varying="tp")] * 2 + [st.SpmdType()]
    if how.startswith(("jax", "st")):   # and their refinements
        assert seen[how][0] == seen["st.grad"][0] == ["Shard['tp', -1]", "Shard['tp', -2]",
                                                      "Invariant"]
    else:  # eqx.partition rebuilds the parameters: a rebuilt typed value is plain Varying
        assert seen[how][0] == ["Varying['tp']", "Varying['tp']", "Invariant"]


def test_gradient_of_a_partial_loss_is_the_gradient_of_the_global_sum(mesh_dp_tp):
    """No psum over tp: the loss is this device's partial sum (Partial over tp, Varying over
    dp and tp for JAX). jax.grad, like st.grad, differentiates the sum over every device."""
    out = {}

    def body(w1, w2, x):
        def typed_loss(w1):
            return st.numpy.tanh(x @ w1) @ w2

        out["loss"] = _describe(typed_loss(w1).sum())
        g_jax = jax.grad(lambda w: typed_loss(w).sum())(w1)
        g_st = st.grad(lambda w: typed_loss(w).sum())(w1)
        out["desc"] = (_describe(g_jax), _describe(g_st))
        return g_jax, g_st

    mesh = mesh_dp_tp
    w1, w2, _ = _params()
    x = _data()
    f = st.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("tp", None), P("dp")),
                     out_specs=(P(None, "tp"), P(None, "tp")))
    g_jax, g_st = jax.jit(f)(put(mesh, w1, P(None, "tp")), put(mesh, w2, P("tp", None)),
                             put(mesh, x, P("dp")))
    ref = jax.grad(lambda w: (jnp.tanh(x @ w) @ w2).sum())(w1)
    np.testing.assert_allclose(np.asarray(g_jax), np.asarray(g_st), rtol=0, atol=0)
    np.testing.assert_allclose(np.asarray(g_jax), np.asarray(ref), **TOL)
    assert out["desc"][0] == out["desc"][1]
    assert "Partial" in out["loss"][0], out["loss"]


def test_has_aux_and_argnums(mesh_dp_tp):
    def body(w1, b, x):
        def loss(w1, b):
            y = st.psum(jnp.tanh(x @ w1).sum(-1), "tp") + b.sum()
            return st.pmean(jnp.mean(y ** 2), "dp"), st.pmean(jnp.mean(y), "dp")

        (val, aux), (g1, gb) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(w1, b)
        assert type(val) is st.Invariant and type(aux) is st.Invariant
        assert type(gb) is st.Invariant
        (g1_st, gb_st), _ = st.grad(loss, argnums=(0, 1), has_aux=True)(w1, b)
        return val, aux, g1, gb, g1_st, gb_st

    mesh = mesh_dp_tp
    w1, _, b = _params()
    x = _data()
    f = st.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P(), P("dp")),
                     out_specs=(P(), P(), P(None, "tp"), P(), P(None, "tp"), P()))
    val, aux, g1, gb, g1_st, gb_st = jax.jit(f)(put(mesh, w1, P(None, "tp")), put(mesh, b),
                                                put(mesh, x, P("dp")))

    def ref(w1, b):
        y = jnp.tanh(x @ w1).sum(-1) + b.sum()
        return jnp.mean(y ** 2), jnp.mean(y)

    (rv, ra), (r1, rb) = jax.value_and_grad(ref, argnums=(0, 1), has_aux=True)(w1, b)
    np.testing.assert_allclose(float(val), float(rv), **TOL)
    np.testing.assert_allclose(float(aux), float(ra), **TOL)
    np.testing.assert_allclose(np.asarray(g1), np.asarray(r1), **TOL)
    np.testing.assert_allclose(np.asarray(gb), np.asarray(rb), **TOL)
    np.testing.assert_array_equal(np.asarray(g1), np.asarray(g1_st))
    np.testing.assert_array_equal(np.asarray(gb), np.asarray(gb_st))


def test_a_raw_parameter_of_a_typed_loss_gets_jax_s_raw_gradient(mesh_dp_tp):
    """No typed primal, a typed loss (a closure over typed data): the gradient is JAX's raw
    value, equal to the reference."""
    seen = {}

    def body(w1, x):
        g = jax.grad(lambda w: st.pmean(jnp.sum(jnp.tanh(x @ w)), "dp"))(w1.raw)
        seen["typed"] = _array.is_typed(g)
        return st.psum(g, "dp")  # g is already summed over dp (Invariant): SPMD103

    def body_ok(w1, x):
        return jax.grad(lambda w: st.pmean(jnp.sum(jnp.tanh(x @ w)), "dp"))(w1.raw)

    mesh = mesh_dp_tp
    w1, _, _ = _params()
    x = _data()
    f = st.shard_map(body_ok, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P())
    g = jax.jit(f)(put(mesh, w1), put(mesh, x, P("dp")))
    ref = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)) / 2)(w1)
    np.testing.assert_allclose(np.asarray(g), np.asarray(ref), **TOL)
    with pytest.raises(st.SpmdTypeError) as info:   # the gradient is Invariant: a psum is SPMD103
        st.shard_map(body, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P())(
            put(mesh, w1), put(mesh, x, P("dp")))
    assert seen["typed"] is False and info.value.code == "SPMD103"


@pytest.mark.parametrize("how", ["jax.grad", "eqx.filter_grad"])
def test_an_unreduced_loss_is_spmd405_naming_the_call(mesh_dp_tp, how):
    def body(w1, x):
        def loss(w):
            return st.pcast(st.numpy.tanh(x @ w).sum(), "tp", to="unreduced")

        grad = jax.grad if how == "jax.grad" else eqx.filter_grad
        with pytest.raises(st.BoundaryError) as info:
            grad(loss)(w1)
        assert info.value.code == "SPMD405" and how in str(info.value)
        assert "st.psum(loss, 'tp')" in str(info.value)
        return w1

    mesh = mesh_dp_tp
    w1, _, _ = _params()
    st.shard_map(body, mesh=mesh, in_specs=(P(None, "tp"), P("dp")), out_specs=P(None, "tp"))(
        put(mesh, w1, P(None, "tp")), put(mesh, _data(), P("dp")))


def test_vmap_of_jax_grad_of_a_per_example_loss_is_spmd407(mesh_dp_tp):
    """As st.grad: the per-example loss varies over dp, the parameter is Invariant there."""
    def net(p, x):
        return st.numpy.sin((p * x).sum())

    def buggy(p, x):
        return jax.vmap(jax.grad(net), in_axes=(None, 0))(p, x)

    mesh = mesh_dp_tp
    f = st.shard_map(buggy, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P("dp"))
    with pytest.raises(st.BoundaryError) as info:
        jax.jit(f).trace(put(mesh, jnp.ones(3)), put(mesh, jnp.ones((8, 3)), P("dp")))
    assert info.value.code == "SPMD407" and "jax.grad under jax.vmap" in str(info.value)


def test_jax_grad_without_typed_values_is_jax_s_own():
    """Outside spmdtyped's values nothing changes: same results, same errors."""
    f = lambda w, x: jnp.sum(jnp.sin(w * x))  # noqa: E731
    w, x = jnp.arange(3.0), jnp.ones(3)
    g = jax.grad(f)(w, x)
    assert type(g) is type(jnp.ones(1))
    np.testing.assert_allclose(g, jnp.cos(w), rtol=1e-6)
    with pytest.raises(TypeError, match="Gradient only defined for scalar-output functions"):
        jax.grad(lambda w: w * 2)(w)
    (v, aux), gw = jax.value_and_grad(lambda w: (jnp.sum(w ** 2), "aux"), has_aux=True)(w)
    assert aux == "aux" and float(v) == 5.0
    np.testing.assert_allclose(gw, 2 * w)


def test_nnx_value_and_grad_of_a_typed_loss(mesh_dp_tp):
    """flax nnx's grad calls jax.value_and_grad: a merged module's typed loss works too."""
    nnx = pytest.importorskip("flax.nnx")

    class Dense(nnx.Module):
        def __init__(self, rngs):
            self.up = nnx.Linear(4, 16, use_bias=False, rngs=rngs)      # column-parallel
            self.down = nnx.Linear(16, 4, use_bias=False, rngs=rngs)    # row-parallel

        def __call__(self, x, tp=None):
            y = self.down(jax.nn.relu(self.up(x)))
            return st.psum(y, tp) if tp else y

    graphdef, params = nnx.split(Dense(nnx.Rngs(0)), nnx.Param)
    specs = jax.tree_util.tree_map_with_path(
        lambda path, _: P(None, "tp") if "up" in str(path) else P("tp", None), params)
    mesh = mesh_dp_tp
    x = jax.random.normal(jax.random.key(2), (8, 4))

    def body(params, x):
        def loss_fn(m):
            return st.pmean(jnp.mean(m(x, "tp") ** 2), "dp")

        loss, grads = nnx.value_and_grad(loss_fn)(nnx.merge(graphdef, params))
        return grads, loss

    f = st.shard_map(body, mesh=mesh, in_specs=(specs, P("dp")), out_specs=(specs, P()))
    grads, loss = jax.jit(f)(jax.tree.map(lambda a, s: put(mesh, a, s), params, specs),
                             put(mesh, x, P("dp")))
    ref_loss, ref = jax.value_and_grad(
        lambda p: jnp.mean(nnx.merge(graphdef, p)(x) ** 2))(params)
    np.testing.assert_allclose(float(loss), float(ref_loss), **TOL)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


def test_second_order_jax_grad_of_a_typed_loss(mesh_dp_tp):
    """jax.grad of jax.grad of a typed loss, and jax.hessian (JAX's own path) next to it."""
    x = jnp.linspace(-1, 1, 32).reshape(8, 4)
    w = jnp.linspace(0.1, 0.3, 4)

    def body(w, x):
        def f(w):
            return st.pmean(jnp.sum(jnp.sin(w * x)), "dp")

        g2 = jax.grad(lambda w: jax.grad(f)(w).sum())(w)
        h = jax.hessian(lambda w: jnp.sum(jnp.sin(w * x.raw)))(w.raw)   # summed over dp
        return g2, h

    f = st.shard_map(body, mesh=mesh_dp_tp, in_specs=(P(), P("dp")), out_specs=(P(), P()))
    g2, h = jax.jit(f)(put(mesh_dp_tp, w), put(mesh_dp_tp, x, P("dp")))
    halves = x.reshape(2, 4, 4)

    def ref(w):
        return jnp.mean(jnp.stack([jnp.sum(jnp.sin(w * halves[i])) for i in range(2)]))

    np.testing.assert_allclose(np.asarray(g2), np.asarray(jax.grad(lambda w: jax.grad(ref)(w).sum())(w)),
                               **TOL)
    np.testing.assert_allclose(np.asarray(h), np.asarray(jax.hessian(lambda w: jnp.sum(jnp.sin(w * x)))(w)),
                               **TOL)


@pytest.mark.parametrize("how", ["jax.grad", "jax.value_and_grad", "eqx.filter_grad"])
def test_gradient_of_a_rep_loss_is_st_grad_s(mesh_dp_tp, how):
    """A Rep loss (one value held by the 8 devices) is seeded with 1/n by `st.grad`; `jax.grad`
    of a typed Rep loss is `st.grad`'s, not JAX's n-fold sum of the copies: equal to `st.grad`
    and to the single-device gradient, and the loss value itself unscaled."""
    w = jax.random.normal(jax.random.key(2), (4, 3))
    x = jax.random.normal(jax.random.key(3), (5, 4))

    def ref_loss(w):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    def body(w, x):
        def loss(w):
            return st.numpy.sum(st.numpy.tanh(x @ st.pcast(w, ("dp", "tp"), to="varying")) ** 2)

        assert _array.refinement_of(loss(w)).get("tp") is not None  # Rep on both axes
        if how == "jax.grad":
            value, g = None, jax.grad(loss)(w)
        elif how == "jax.value_and_grad":
            value, g = jax.value_and_grad(loss)(w)
        else:
            value, g = None, eqx.filter_grad(loss)(w)
        s = st.grad(loss)(w)
        value = loss(w) if value is None else value
        return g, s, value[None]

    f = jax.jit(st.shard_map(body, mesh=mesh_dp_tp, in_specs=(P(), P()),
                             out_specs=(P(), P(), P(("dp", "tp")))))
    g, s, value = f(w, x)
    np.testing.assert_allclose(np.asarray(g), np.asarray(s), rtol=0, atol=0)
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(ref_loss)(w)), **TOL)
    np.testing.assert_allclose(np.asarray(value), np.full((8,), float(ref_loss(w))), rtol=1e-5)
