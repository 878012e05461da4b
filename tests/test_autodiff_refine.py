"""Autodiff of refined values (issue 15, item 5): the cotangent rule on refinements, the
gradient of a Partial loss, and per-example gradients under vmap (SPMD407).

Every gradient is compared with a single-device reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped._rules.refine import PARTIAL, REP, Refinement, Shard
from spmdtyped._typed import array as _array

DP = 8


@pytest.fixture(scope="module")
def mesh_dp():
    return jax.make_mesh((DP,), ("dp",), axis_types=(AxisType.Auto,))


def _normal(seed, shape):
    return jax.random.normal(jax.random.key(seed), shape, dtype=jnp.float32)


def _shard(x, axis, dim):
    return _array.with_refinement(x, Refinement.of({axis: Shard(dim)}, data=True))


def test_gradients_carry_the_cotangent_refinement_and_match_the_reference(mesh_dp):
    """w Invariant -> Invariant gradient (the global sum); r = pvary(w) is Rep -> its gradient
    is Partial (per-device terms); x Shard(dp, 0) -> Shard(dp, 0)."""
    w, xs = _normal(1, (3,)), _normal(2, (16, 3))
    seen = {}

    def body(w, x):
        x = _shard(x, "dp", -2)
        r = st.pcast(w, "dp", to="varying")
        r = _array.with_refinement(r, Refinement.of({"dp": REP}, data=True))

        def loss(w, r, x):
            return st.numpy.sin(x @ w + x @ r).sum()

        gw, gr, gx = st.grad(loss, argnums=(0, 1, 2))(w, r, x)
        seen.update(w=_array.refinement_of(gw), r=_array.refinement_of(gr),
                    x=_array.refinement_of(gx), tw=st.typeof(gw), tr=st.typeof(gr))
        return gw, st.psum(gr, "dp"), gx

    f = jax.jit(st.shard_map(body, mesh=mesh_dp, in_specs=(P(), P("dp")),
                             out_specs=(P(), P(), P("dp"))))
    gw, gr, gx = f(w, xs)
    assert seen["w"].items == () and seen["w"].grad and seen["tw"] == st.SpmdType()
    assert seen["r"].grad and seen["x"].grad   # gradients: SPMD108 checks their psums
    assert seen["r"].get("dp") is PARTIAL and seen["tr"] == st.SpmdType(varying="dp")
    assert seen["x"].get("dp") == Shard(-2)

    def ref(w, r, x):
        return jnp.sum(jnp.sin(x @ w + x @ r))

    rw, rr, rx = jax.grad(ref, argnums=(0, 1, 2))(w, w, xs)
    np.testing.assert_allclose(gw, rw, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(gr, rr, rtol=1e-5, atol=1e-5)   # psum of the Partial terms
    np.testing.assert_allclose(gx, rx, rtol=1e-5, atol=1e-5)


def test_vjp_cotangents_carry_the_refinement(mesh_dp):
    seen = {}

    def body(x):
        x = _shard(x, "dp", -1)
        y, pull = st.vjp(lambda x: st.numpy.sin(x) * 2.0, x)
        (ct,) = pull(jnp.ones_like(y.raw))
        seen.update(y=_array.refinement_of(y), ct=_array.refinement_of(ct))
        return ct

    xs = _normal(3, (16,))
    got = jax.jit(st.shard_map(body, mesh=mesh_dp, in_specs=P("dp"), out_specs=P("dp")))(xs)
    assert seen["ct"].get("dp") == Shard(-1)
    np.testing.assert_allclose(got, 2.0 * jnp.cos(xs), rtol=1e-5, atol=1e-5)


def test_grad_of_a_partial_loss_is_the_gradient_of_the_global_sum(mesh_dp):
    """loss = sum over a Shard(dp) dim: Partial(dp); st.grad takes it as the global sum."""
    w, xs = _normal(4, (3,)), _normal(5, (16, 3))
    seen = {}

    def body(w, x):
        def loss(w):
            part = st.numpy.tanh(_shard(x, "dp", -2) @ w).sum()
            part = _array.with_refinement(part, Refinement.of({"dp": PARTIAL}, data=True))
            seen["loss"] = _array.refinement_of(part)
            return part

        val, g = st.value_and_grad(loss)(w)
        seen["val"] = _array.refinement_of(val)
        return st.psum(val, "dp"), g

    total, g = jax.jit(st.shard_map(body, mesh=mesh_dp, in_specs=(P(), P("dp")),
                                    out_specs=(P(), P())))(w, xs)
    assert seen["loss"].get("dp") is PARTIAL and seen["val"].get("dp") is PARTIAL

    def ref(w):
        return jnp.sum(jnp.tanh(xs @ w))

    np.testing.assert_allclose(total, ref(w), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(g, jax.grad(ref)(w), rtol=1e-5, atol=1e-5)


def _net(p, x):
    return st.numpy.sin((p * x).sum())


def test_vmap_grad_of_a_varying_loss_wrt_an_invariant_parameter_is_spmd407(mesh_dp):
    params, xs = _normal(6, (3,)), _normal(7, (16, 3))

    def buggy(p, x):
        return jax.vmap(st.grad(_net), in_axes=(None, 0))(p, x)

    f = st.shard_map(buggy, mesh=mesh_dp, in_specs=(P(), P("dp")), out_specs=P("dp"))
    with pytest.raises(st.BoundaryError) as info:
        jax.jit(f).trace(params, xs)
    assert info.value.code == "SPMD407"
    assert "pcast(params, 'dp', to='varying')" in str(info.value)


def test_vmap_grad_after_the_fix_gives_per_example_gradients(mesh_dp):
    params, xs = _normal(6, (3,)), _normal(7, (16, 3))

    def fixed(p, x):
        p = st.pcast(p, "dp", to="varying")
        return jax.vmap(st.grad(_net), in_axes=(None, 0))(p, x)

    got = jax.jit(st.shard_map(fixed, mesh=mesh_dp, in_specs=(P(), P("dp")),
                               out_specs=P("dp")))(params, xs)
    ref = jax.vmap(jax.grad(lambda p, x: jnp.sin(jnp.sum(p * x))), in_axes=(None, 0))(params, xs)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_vmap_grad_summed_over_the_batch_is_the_strict_case(mesh_dp):
    """F6: sum(vmap(grad)) w.r.t. an Invariant parameter is the total gradient (right): the
    strict SPMD407 rejects it, `st.allow` accepts it and the numbers match the reference."""
    params, xs = _normal(8, (3,)), _normal(9, (16, 3))

    def total(p, x):
        return jax.vmap(st.grad(_net), in_axes=(None, 0))(p, x).sum(0)

    f = st.shard_map(total, mesh=mesh_dp, in_specs=(P(), P("dp")), out_specs=P())
    with pytest.raises(st.BoundaryError, match="SPMD407"):
        jax.jit(f).trace(params, xs)
    with st.allow("SPMD407"):
        got = jax.jit(f)(params, xs)
    ref = jax.grad(lambda p: jnp.sum(jnp.sin(xs @ p)))(params)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_vmap_grad_without_a_varying_loss_is_accepted(mesh_dp):
    """Per-example gradients of an Invariant loss (samples replicated): nothing is summed."""
    params, xs = _normal(10, (3,)), _normal(11, (4, 3))

    def body(p, x):
        return jax.vmap(st.grad(_net), in_axes=(None, 0))(p, x)

    got = jax.jit(st.shard_map(body, mesh=mesh_dp, in_specs=(P(), P()), out_specs=P()))(params, xs)
    ref = jax.vmap(jax.grad(lambda p, x: jnp.sin(jnp.sum(p * x))), in_axes=(None, 0))(params, xs)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- control flow joins


def test_loop_carries_and_branch_outputs_join_refinements(mesh_dp):
    """A carry keeps its Shard when every iteration keeps it, and loses it (plain) when the
    body gives something else; cond outputs take the join of both branches; scan slices drop
    a Shard on the scanned dim; a varying condition leaves only Shards."""
    seen = {}

    def same(new, like):  # the refinement the runtime gives `like * 2.0` (kept: a literal)
        return _array.with_refinement(new, _array.refinement_of(like))

    def body(x):
        xs = _shard(x, "dp", -1)                                    # [4, 2] local, Shard(-1)
        keep = st.fori_loop(0, 3, lambda i, c: same(c * 2.0, c), xs)
        seen["keep"] = _array.refinement_of(keep)
        lose = st.fori_loop(0, 3, lambda i, c: _array.with_refinement(c * 2.0, Refinement()), xs)
        seen["lose"] = _array.refinement_of(lose)
        rows = _shard(x, "dp", -2)                                  # Shard on the scanned dim
        _, ys = st.scan(lambda c, r: (c, same(r * 1.0, r)), 0.0, rows)
        seen["ys"] = _array.refinement_of(ys)
        _, ys2 = st.scan(lambda c, r: (c, same(r * 1.0, r)), 0.0, xs)       # Shard(-1) survives slicing
        seen["ys2"] = _array.refinement_of(ys2)
        both = st.cond(x[0, 0] > 0, lambda v: same(v * 2.0, v), lambda v: same(v * 3.0, v), xs)
        seen["both"] = _array.refinement_of(both)
        one = st.cond(x[0, 0] > 0, lambda v: same(v * 2.0, v),
                      lambda v: _array.with_refinement(v * 3.0, Refinement()), xs)
        seen["one"] = _array.refinement_of(one)
        rep = st.pcast(st.psum(x.sum(), "dp"), "dp", to="varying")
        rep = _array.with_refinement(rep, Refinement.of({"dp": REP}, data=True))
        w = st.while_loop(lambda c: c[1] < st.axis_index("dp"), lambda c: (same(c[0] * 2.0, c[0]), c[1] + 1),
                          (rep, 0))
        seen["while"] = _array.refinement_of(w[0])
        return keep

    x = jnp.arange(32.0).reshape(4, 8)
    out = jax.jit(st.shard_map(body, mesh=mesh_dp, in_specs=P(None, "dp"),
                               out_specs=P(None, "dp")))(x)
    np.testing.assert_allclose(out, x * 8.0)
    assert seen["keep"].get("dp") == Shard(-1)
    assert seen["lose"].get("dp") is None
    assert seen["ys"].get("dp") is None
    assert seen["ys2"].get("dp") == Shard(-1)
    assert seen["both"].get("dp") == Shard(-1)
    assert seen["one"].get("dp") is None
    assert seen["while"].get("dp") is None          # Rep does not survive a varying trip count


def test_grad_of_a_rep_loss_is_the_gradient_of_the_value_on_dp_tp(mesh_dp_tp):
    """A Rep loss (one value held by every device) is not a sum of per-device terms: JAX seeds
    every copy with 1 and would give n times the gradient (8 on dp=2 x tp=4); `st.grad` seeds
    it with 1/n. Numbers against the single-device gradient, for an Invariant parameter, a Rep
    one (Partial gradient: its psum is the gradient) and a loss Rep on one axis only."""
    w, x = _normal(11, (4, 3)), _normal(12, (5, 4))

    def ref_loss(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    want = jax.grad(ref_loss)(w, x)
    seen = {}

    def body(w, x):
        def loss(w):
            wv = st.pcast(w, ("dp", "tp"), to="varying")
            out = st.numpy.sum(st.numpy.tanh(x @ wv) ** 2)
            seen["loss"] = _array.refinement_of(out)
            return out

        g_inv = st.grad(loss)(w)                                   # Invariant parameter
        r = st.pcast(w, ("dp", "tp"), to="varying")                # Rep parameter
        g_rep = st.grad(lambda r: st.numpy.sum(st.numpy.tanh(x @ r) ** 2))(r)
        seen["g_rep"] = _array.refinement_of(g_rep)
        # Rep over tp, plain over dp (a dp-dependent scale): the dp copies are summed
        xd = x * (st.axis_index("dp") + 1.0)
        g_mix = st.grad(lambda w: st.numpy.sum(st.numpy.tanh(
            xd @ st.pcast(w, "tp", to="varying")) ** 2))(w)
        return g_inv, st.psum(g_rep, ("dp", "tp")), g_mix

    f = jax.jit(st.shard_map(body, mesh=mesh_dp_tp, in_specs=(P(), P()),
                             out_specs=(P(), P(), P())))
    g_inv, g_rep, g_mix = f(w, x)
    assert seen["loss"].get("dp") is REP and seen["loss"].get("tp") is REP
    assert seen["g_rep"].get("dp") is PARTIAL and seen["g_rep"].get("tp") is PARTIAL
    np.testing.assert_allclose(g_inv, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g_rep, want, rtol=1e-5, atol=1e-6)
    mix = sum(jax.grad(ref_loss)(w, x * (d + 1.0)) for d in range(2))
    np.testing.assert_allclose(g_mix, mix, rtol=1e-5, atol=1e-6)
    # the loss value itself is returned unscaled
    val = jax.jit(st.shard_map(
        lambda w, x: st.value_and_grad(lambda w: st.numpy.sum(st.numpy.tanh(
            x @ st.pcast(w, ("dp", "tp"), to="varying")) ** 2))(w)[0][None],
        mesh=mesh_dp_tp, in_specs=(P(), P()), out_specs=P(("dp", "tp"))))(w, x)
    np.testing.assert_allclose(val, np.full((8,), ref_loss(w, x)), rtol=1e-5)
