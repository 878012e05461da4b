"""Typed autodiff: st.grad / st.value_and_grad / st.vjp, and jax.grad on typed functions.

Differential: the state of every typed cotangent equals the state JAX gives the cotangent of
the same raw program (and `_rules.cotangent` of the primal's state).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import I, Ri, Ui, Vi, make, make_raw, mesh_ij, outcome, put, trace_raw
from hypothesis import assume, given, settings
from hypothesis import strategies as hst
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import SpmdType, _compat, _rules

PARAM_STATES = [I, Vi, SpmdType(varying="j"), Ri, SpmdType(reduced="j"),
                SpmdType(varying="j", reduced="i"), SpmdType(varying=("i", "j"))]
DATA_STATES = [I, Vi, SpmdType(varying="j"), SpmdType(varying=("i", "j"))]
UNARY = {"id": (lambda h: h, lambda h: h), "sin": (st.numpy.sin, jnp.sin),
         "tanh": (st.numpy.tanh, jnp.tanh), "square": (lambda h: h * h, lambda h: h * h),
         "silu": (st.nn.silu, jax.nn.silu)}


def _if_varying(axis, fn):
    return lambda h: fn(h) if st.typeof(h).state(axis) is _rules.V else h


_PERM = [(k, (k + 1) % 4) for k in range(4)]
#: collectives, applied where the value is Varying on their axis (their transposes: psum <->
#: pvary, all_gather <-> psum_scatter, ppermute <-> inverse ppermute)
UNARY.update({
    "psum_i": (_if_varying("i", lambda h: st.psum(h, "i")),
               _if_varying("i", lambda h: jax.lax.psum(h, "i"))),
    "gather_j": (_if_varying("j", lambda h: st.all_gather(h, "j", tiled=True)[:4]),
                 _if_varying("j", lambda h: jax.lax.all_gather(h, "j", tiled=True)[:4])),
    "permute_j": (_if_varying("j", lambda h: st.ppermute(h, "j", _PERM)),
                  _if_varying("j", lambda h: jax.lax.ppermute(h, "j", _PERM))),
})


def _program(ops, reduce_loss, lib):
    """loss(w1, w2, x) = sum(f(x * w1) * w2) [psum'd over its varying axes]."""
    def loss(w1, w2, x):
        h = x * w1
        for name in ops:
            h = UNARY[name][lib](h)
        h = h * w2
        if lib == 0:
            out = h.sum()
            if reduce_loss and st.typeof(out).varying:
                out = st.psum(out, tuple(sorted(st.typeof(out).varying)))
            return out
        out = h.sum()
        if reduce_loss and st.typeof(out).varying:
            out = jax.lax.psum(out, tuple(sorted(st.typeof(out).varying)))
        return out
    return loss


@settings(max_examples=40, deadline=None)
@given(hst.sampled_from(PARAM_STATES), hst.sampled_from(PARAM_STATES),
       hst.sampled_from(DATA_STATES), hst.lists(hst.sampled_from(sorted(UNARY)), max_size=3),
       hst.booleans())
def test_grad_cotangent_states_equal_jax(s1, s2, sx, ops, reduce_loss):
    result: dict[str, object] = {}

    def body(x0):
        w1, w2, x = make(x0, s1), make(x0, s2), make(x0, sx)
        typed = outcome(lambda: st.value_and_grad(_program(ops, reduce_loss, 0), argnums=(0, 1))(w1, w2, x))
        raw = outcome(lambda: jax.value_and_grad(_program(ops, reduce_loss, 1), argnums=(0, 1))(
            make_raw(x0, s1), make_raw(x0, s2), make_raw(x0, sx)))
        result["typed"], result["raw"] = typed, raw
        if typed[0] == "ok":
            assert raw[0] == "ok", raw  # spmdtyped accepts only what JAX accepts
            (loss, (g1, g2)), (rloss, (r1, r2)) = typed[1], raw[1]
            assert st.typeof(loss) == st.typeof(rloss)
            assert st.typeof(g1) == st.typeof(r1) == _rules.cotangent(s1)
            assert st.typeof(g2) == st.typeof(r2) == _rules.cotangent(s2)
        else:  # a rejection is spmdtyped's own, with a code (never a raw JAX error)
            assert typed[0] == "spmd", typed
    trace_raw(body)
    assume(result["typed"][0] == "ok")


@settings(max_examples=30, deadline=None)
@given(hst.sampled_from(PARAM_STATES + [Ui, SpmdType(varying="j", unreduced="i")]),
       hst.sampled_from(["id", "sum", "scale"]))
def test_vjp_cotangent_states_equal_jax(s, kind):
    fns = {"id": (lambda w: w, lambda w: w), "sum": (lambda w: w.sum(), lambda w: w.sum()),
           "scale": (lambda w: w * 3.0, None)}
    typed_f, raw_f = fns[kind]

    def body(x0):
        w = make(x0, s)
        got = outcome(lambda: st.vjp(typed_f, w))
        if got[0] != "ok":
            return
        y, pull = got[1]
        ct_t = st.cotangent_type(y)
        assert ct_t == _rules.cotangent(st.typeof(y))
        ct = make_raw(jnp.ones(y.shape, y.dtype), ct_t)
        (g,) = pull(ct)
        assert st.typeof(g) == _rules.cotangent(s)
        if raw_f is not None:
            ry, rpull = jax.vjp(raw_f, make_raw(x0, s))
            (rg,) = rpull(ct)
            assert st.typeof(ry) == st.typeof(y) and st.typeof(rg) == st.typeof(g)
    trace_raw(body)


def test_zero_step_typed_end_to_end():
    def body(x0):
        x = make(x0, Vi)                                  # this device's data
        shard = make(x0, Vi)[:2]                          # this device's parameter shard
        w = st.all_gather(shard, "i", to="reduced", tiled=True)
        assert type(w) is st.Reduced["i"]

        def loss_fn(w, x):
            return st.numpy.tanh(x * w).sum()             # Varying["i"]: per-device loss

        loss, g = st.value_and_grad(loss_fn)(w, x)
        assert type(loss) is st.Varying["i"] and type(g) is st.Unreduced["i"]
        g_shard = st.psum_scatter(g, "i", tiled=True)
        assert type(g_shard) is st.Varying["i"] and g_shard.shape == shard.shape
        new = shard - 0.1 * g_shard
        assert type(new) is st.Varying["i"]
        # the gradient of the shard itself: all_gather(to="reduced") transposes to psum_scatter
        gs = st.grad(lambda s, x: loss_fn(st.all_gather(s, "i", to="reduced", tiled=True), x))(shard, x)
        assert type(gs) is st.Varying["i"]
    trace_raw(body)


def test_grad_of_invariant_param_is_summed_like_jax():
    m = mesh_ij()
    xs = put(m, jnp.arange(8.0), P(("i", "j")))
    w0 = put(m, jnp.float32(1.5), P())

    def typed(x, w):
        g = st.grad(lambda w, x: (st.wrap(x) * w * w).sum())(st.wrap(w), x)
        assert type(g) is st.Invariant
        return g.raw

    def raw(x, w):
        return jax.grad(lambda w, x: (x * w * w).sum())(w, x)

    f = lambda fn: jax.jit(jax.shard_map(fn, mesh=m, in_specs=(P(("i", "j")), P()), out_specs=P()))  # noqa: E731
    np.testing.assert_array_equal(np.asarray(f(typed)(xs, w0)), np.asarray(f(raw)(xs, w0)))
    assert float(f(typed)(xs, w0)) == pytest.approx(2 * 1.5 * float(jnp.arange(8.0).sum()))


def test_value_and_grad_has_aux_and_argnums():
    def body(x0):
        x, w = make(x0, Vi), make(x0, Ri)

        def f(w, x):
            y = x * w
            return y.sum(), {"y": y}

        (loss, aux), (gw, gx) = st.value_and_grad(f, argnums=(0, 1), has_aux=True)(w, x)
        assert type(loss) is st.Varying["i"] and type(aux["y"]) is st.Varying["i"]
        assert type(gw) is st.Unreduced["i"] and type(gx) is st.Varying["i"]
        g, aux2 = st.grad(f, has_aux=True)(w, x)
        assert type(g) is st.Unreduced["i"] and type(aux2["y"]) is st.Varying["i"]
        out, pull, aux3 = st.vjp(f, w, x, has_aux=True)
        assert type(aux3["y"]) is st.Varying["i"]
    trace_raw(body)


def test_grad_accepts_raw_and_pytree_arguments():
    def body(x0):
        params = {"a": make(x0, Ri), "b": x0}
        g = st.grad(lambda p, x: (p["a"] * x + p["b"]).sum())(params, make(x0, Vi))
        assert type(g["a"]) is st.Unreduced["i"] and type(g["b"]) is st.Invariant
    trace_raw(body)


def test_jax_grad_and_vjp_on_typed_functions():
    """Typed values are pytrees: jax.grad/jax.vjp rebuild cotangents in their own state."""
    def body(x0):
        x, w = make(x0, Vi), make(x0, Ri)
        g = jax.grad(lambda w: (w * x).sum().raw)(w)
        assert type(g) is st.Unreduced["i"]
        y, pull = jax.vjp(lambda w: w * x, w)
        assert type(y) is st.Varying["i"]
        (g2,) = pull(y)
        assert type(g2) is st.Unreduced["i"]
        # jax.vjp matches the cotangent's pytree structure, and a typed value's node type is
        # its state class: a cotangent of an Unreduced output travels in the output's class
        # (st.vjp takes it in its own state)
        u = make(x0, Ui)
        y, pull = jax.vjp(lambda u: u * 2.0, u)
        with pytest.raises(ValueError, match="tree structure"):
            pull(make(jnp.ones(4), Ri))
        (gu,) = pull(type(y)(make_raw(jnp.ones(4), Ri)))
        assert type(gu) is st.Reduced["i"]
        _, spull = st.vjp(lambda u: u * 2.0, u)
        assert type(spull(make(jnp.ones(4), Ri))[0]) is st.Reduced["i"]
    trace_raw(body)


def test_reduced_or_unreduced_loss_is_spmd405():
    def body(x0):
        r = make(x0, Ri)
        if _compat.FEATURES.reduced_loss_grad:
            # jax 0.12.1 seeds a Reduced loss with an Unreduced cotangent: the gradients' sum is
            # the derivative of the replicated loss (2 r here), as JAX computes it
            # (numbers: test_reduced_loss_and_loop_gradients_equal_the_reference)
            g = st.grad(lambda r: (r * r).sum())(r)
            assert type(g) is st.Unreduced["i"]
            raw = jax.grad(lambda r: (r * r).sum())(make_raw(x0, Ri))
            assert st.typeof(raw) == SpmdType(unreduced="i")
        else:
            with pytest.raises(st.BoundaryError) as e:
                st.grad(lambda r: (r * r).sum())(r)
            msg = str(e.value)
            assert e.value.code == "SPMD405" and "st.grad: the loss is Reduced over 'i'" in msg
            assert "fix: st.pcast(loss, 'i', to='varying')" in msg
            # JAX rejects the same program, later and without a code
            assert outcome(lambda: jax.grad(lambda r: (r * r).sum())(make_raw(x0, Ri)))[0] == "jax"
        u = make(x0, Ui)
        with pytest.raises(st.BoundaryError) as e:
            st.value_and_grad(lambda u: u.sum())(u)
        assert e.value.code == "SPMD405" and "Unreduced over 'i'" in str(e.value)
        assert "st.psum(loss, 'i')" in str(e.value)
    trace_raw(body)


def test_wrong_cotangent_state_is_spmd404():
    def body(x0):
        r = make(x0, Ri)
        y, pull = st.vjp(lambda r: r * 2.0, r)
        assert type(y) is st.Reduced["i"]
        with pytest.raises(st.BoundaryError) as e:
            pull(jnp.ones(4))                                   # Invariant, wants Unreduced
        msg = str(e.value)
        assert e.value.code == "SPMD404"
        assert "the cotangent of output is Invariant over 'i'" in msg and "must be Unreduced" in msg
        with pytest.raises(st.BoundaryError):
            pull(make(jnp.ones(4), Ri))                          # the primal's state
        (g,) = pull(make(jnp.ones(4), Ui))
        assert type(g) is st.Unreduced["i"]
        # JAX's own error for the same mistake has no code
        _, rpull = jax.vjp(lambda r: r * jax.lax.pcast(jnp.float32(2.0), "i", to="reduced"),
                           make_raw(x0, Ri))
        assert outcome(lambda: rpull(jnp.ones(4)))[0] == "jax"
    trace_raw(body)


def test_cotangent_type_and_transpose_table():
    t = SpmdType(varying="j", reduced="i")
    assert _rules.cotangent(t) == SpmdType(varying="j", unreduced="i")
    assert _rules.grad_loss_type(SpmdType(varying="i")) == SpmdType(varying="i")
    assert _rules.TRANSPOSES["all_gather"] == "psum_scatter" and _rules.TRANSPOSES["pvary"] == "psum"
    assert st.cotangent_type(t) == SpmdType(varying="j", unreduced="i")


def test_loop_with_reduced_constant_is_spmd406_and_the_fix_works():
    """JAX cannot transpose a loop over a Reduced constant or carry (both versions); the cast
    to Varying before the loop is free and keeps the gradient Unreduced."""
    def body(x0):
        w, v = make(x0, Ri), make(x0, Vi)

        def fixed(w):
            wv = st.pcast(w, "i", to="varying")
            return st.fori_loop(0, 3, lambda i, c: c * wv, v).sum()

        if _compat.FEATURES.loop_transposes_reduced:
            # jax 0.12.1 differentiates the loop itself: the same gradient as the cast's
            # (numbers: test_reduced_loss_and_loop_gradients_equal_the_reference)
            g = st.grad(lambda w: st.fori_loop(0, 3, lambda i, c: c * w, v).sum())(w)
            assert type(g) is st.Unreduced["i"] and type(st.grad(fixed)(w)) is st.Unreduced["i"]
            return
        with pytest.raises(st.BoundaryError) as e:
            st.grad(lambda w: st.fori_loop(0, 3, lambda i, c: c * w, v).sum())(w)
        msg = str(e.value)
        assert e.value.code == "SPMD406" and e.value.axes == ("i",)
        assert "fix: cast them to Varying before the loop: w = st.pcast(w, 'i', to='varying')" in msg
        with pytest.raises(st.BoundaryError, match="SPMD406"):
            st.grad(lambda w: st.scan(lambda c, _: (c * w, None), v, length=2)[0].sum())(w)
        with pytest.raises(st.BoundaryError, match="SPMD406"):
            _, pull = st.vjp(lambda w: st.fori_loop(0, 3, lambda i, c: c * w, v), w)
            pull(st.wrap(jnp.ones(4)) + v * 0.0)
        # JAX alone fails on the same program
        assert outcome(lambda: jax.grad(lambda w: jax.lax.fori_loop(
            0, 3, lambda i, c: c * w, make_raw(x0, Vi)).sum())(make_raw(x0, Ri)))[0] == "jax"
        assert type(st.grad(fixed)(w)) is st.Unreduced["i"]
    trace_raw(body)


@pytest.mark.skipif(not _compat.FEATURES.reduced_loss_grad,
                    reason="jax < 0.12.1 rejects these programs (SPMD405, SPMD406)")
def test_reduced_loss_and_loop_gradients_equal_the_reference():
    """jax 0.12.1: a Reduced loss and a loop over a Reduced constant are differentiated; the
    Unreduced gradients, summed, equal a single-device reference."""
    mesh = mesh_ij()
    x = jax.device_put(jnp.arange(1.0, 9.0), jax.sharding.NamedSharding(mesh, P("i")))

    def step(x):
        r = st.pcast(st.psum(st.wrap(x), "i"), "i", to="reduced")  # replicated, Reduced over i
        v = st.wrap(x)                                              # this device's shard
        g1 = st.grad(lambda r: st.numpy.sin(r).sum())(r)
        g2 = st.grad(lambda w: st.fori_loop(0, 3, lambda k, c: c * w, v).sum())(r)
        return st.psum(g1, "i").raw, st.psum(g2, "i").raw

    g1, g2 = jax.jit(st.shard_map(step, mesh=mesh, in_specs=P("i"), out_specs=(P(), P())))(x)
    xs = np.arange(1.0, 9.0).reshape(2, 4)
    r = xs.sum(0)
    np.testing.assert_allclose(np.asarray(g1), np.cos(r), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g2), 3 * r ** 2 * xs.sum(0), rtol=1e-5)


#: (name, typed collective, raw collective, input state): the transpose pairs of reference §5
COLLECTIVES = [
    ("psum", lambda x: st.psum(x, "i"), lambda x: jax.lax.psum(x, "i"), Vi),
    ("psum(U)", lambda x: st.psum(x, "i"), lambda x: jax.lax.psum(x, "i"), Ui),
    ("pvary", lambda x: st.pvary(x, "i"), lambda x: jax.lax.pcast(x, "i", to="varying"), I),
    ("pcast reduced", lambda x: st.pcast(x, "i", to="reduced"),
     lambda x: jax.lax.pcast(x, "i", to="reduced"), I),
    ("pcast unreduced", lambda x: st.pcast(x, "i", to="unreduced"),
     lambda x: jax.lax.pcast(x, "i", to="unreduced"), Vi),
    ("pcast R->V", lambda x: st.pcast(x, "i", to="varying"),
     lambda x: jax.lax.pcast(x, "i", to="varying"), Ri),
    ("all_gather", lambda x: st.all_gather(x, "j", tiled=True),
     lambda x: jax.lax.all_gather(x, "j", tiled=True), SpmdType(varying="j")),
    ("all_gather invarying", lambda x: st.all_gather(x, "j", tiled=True, to="invarying"),
     lambda x: jax.lax.all_gather(x, "j", tiled=True, to="invarying"), SpmdType(varying="j")),
    ("all_gather reduced", lambda x: st.all_gather(x, "i", tiled=True, to="reduced"),
     lambda x: jax.lax.all_gather(x, "i", tiled=True, to="reduced"), Vi),
    ("psum_scatter", lambda x: st.psum_scatter(x, "i", tiled=True),
     lambda x: jax.lax.psum_scatter(x, "i", tiled=True), Vi),
    ("psum_scatter(U)", lambda x: st.psum_scatter(x, "i", tiled=True),
     lambda x: jax.lax.psum_scatter(x, "i", tiled=True), Ui),
    ("ppermute", lambda x: st.ppermute(x, "j", [(k, (k + 1) % 4) for k in range(4)]),
     lambda x: jax.lax.ppermute(x, "j", [(k, (k + 1) % 4) for k in range(4)]), SpmdType(varying="j")),
    ("all_to_all", lambda x: st.all_to_all(x, "j", 0, 0, tiled=True),
     lambda x: jax.lax.all_to_all(x, "j", 0, 0, tiled=True), SpmdType(varying="j")),
]


@pytest.mark.parametrize("name", [c[0] for c in COLLECTIVES])
def test_vjp_of_collectives_transposes_like_jax(name):
    _, typed_f, raw_f, t = next(c for c in COLLECTIVES if c[0] == name)

    def body(x0):
        x = make(x0, t)
        y, pull = st.vjp(typed_f, x)
        ct = make_raw(jnp.ones(y.shape, y.dtype), st.cotangent_type(y))
        (g,) = pull(ct)
        ry, rpull = jax.vjp(raw_f, make_raw(x0, t))
        (rg,) = rpull(ct)
        assert st.typeof(y) == st.typeof(ry)
        assert st.typeof(g) == st.typeof(rg) == _rules.cotangent(t), (name, st.typeof(g))
    trace_raw(body, (8,))


def test_jax_nn_softmax_of_a_typed_value_under_grad_equals_raw_jax():
    """jax.nn.softmax is a custom_jvp function (on by default in jax 0.12.1): its rule gets
    the typed value and a typed tangent, and must return a raw tangent like its raw primal.
    Operators applied by JAX's own code compute as on jax.Array; the gradient equals the raw
    program's."""
    mesh = mesh_ij()
    x = jax.device_put(jnp.linspace(-1.0, 1.0, 32).reshape(8, 4),
                       jax.sharding.NamedSharding(mesh, P("i")))
    w = jnp.linspace(0.5, 1.5, 16).reshape(4, 4)

    def typed(w, x):
        p = jax.nn.softmax(st.wrap(x) @ w, axis=-1)       # a typed value into jax.nn
        return st.psum((p * p).sum(), "i").raw

    def raw(w, x):
        p = jax.nn.softmax(x @ w, axis=-1)
        return jax.lax.psum((p * p).sum(), "i")

    def grad_of(body):
        f = jax.shard_map(body, mesh=mesh, in_specs=(P(), P("i")), out_specs=P(), axis_names={"i"})
        return jax.jit(jax.grad(lambda w: f(w, x)))(w)

    np.testing.assert_allclose(np.asarray(grad_of(typed)), np.asarray(grad_of(raw)), rtol=1e-6)


def _act_and_grad(unwrap_tangent: bool):
    """A custom_jvp activation of the user's own (jnp inside, as people write them) under
    `jax.grad` in an `st.shard_map` step hinted at the step: its rule gets typed primals and
    tangents; `jnp.tanh` of the typed primal is raw, the typed tangent times it typed."""
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))

    @jax.custom_jvp
    def act(x):
        return jnp.tanh(x)

    @act.defjvp
    def act_jvp(primals, tangents):
        (x,), (t,) = primals, tangents
        y = act(x)
        return y, (st.unwrap(t) if unwrap_tangent else t) * (1 - y ** 2)

    def loss(w, x, mean):
        return mean(jnp.mean(act(x @ w) ** 2))

    @st.shard_map(mesh=mesh, in_specs=(P(), P("dp")), out_specs=P())
    def step(w, x: st.Varying["dp"]):
        return jax.grad(loss)(w, x, lambda v: jax.lax.pmean(v, "dp"))

    w = jnp.linspace(-1.0, 1.0, 16).reshape(4, 4)
    x = jnp.linspace(-2.0, 2.0, 32).reshape(8, 4)
    placed = (jax.device_put(w, jax.sharding.NamedSharding(mesh, P())),
              jax.device_put(x, jax.sharding.NamedSharding(mesh, P("dp"))))
    return step, placed, jax.grad(loss)(w, x, lambda v: v)


def test_custom_jvp_rule_mixing_a_typed_tangent_with_raw_values_says_how_to_fix_it():
    """JAX requires the rule's primal and tangent outputs to have one pytree structure; a typed
    tangent beside a raw primal fails in JAX with a note of spmdtyped's (what happened, the
    fix); the fix (`st.unwrap(t)`) gives one device's gradient."""
    step, placed, _ref = _act_and_grad(unwrap_tangent=False)
    with pytest.raises(TypeError, match="equal container") as e:
        step(*placed)
    notes = "\n".join(getattr(e.value, "__notes__", ()))
    assert "typed primals and tangents" in notes and "st.unwrap(t)" in notes, notes

    step, placed, ref = _act_and_grad(unwrap_tangent=True)
    np.testing.assert_allclose(np.asarray(step(*placed)), np.asarray(ref), rtol=1e-5, atol=1e-7)
