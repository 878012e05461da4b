"""Typed control flow: fori_loop / scan / while_loop / cond / switch, differential against JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import SAMPLE, I, Ri, Ui, Vi, Vj, all_states, make, make_raw, mesh_ij, outcome, put, trace_raw
from hypothesis import given, settings
from hypothesis import strategies as hst
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import SpmdType, _rules


def _raw_cast(raw, frm: SpmdType, to: SpmdType):
    for target, axes in _rules.free_casts(frm, to) or ():
        raw = jax.lax.pcast(raw, axes, to=target)
    return raw


# ----------------------------------------------------------------------------- the join rule


def test_join_carry_rule_table():
    j = _rules.join_carry
    assert j(I, Vi) == Vi and j(Vi, I) == Vi
    assert j(I, Ri) == Ri and j(Ri, Vi) == Vi
    assert j(Ui, Ui) == Ui
    assert j(SpmdType(varying="j", reduced="i"), Vi) == SpmdType(varying=("i", "j"))
    for a, b in [(Ui, I), (I, Ui), (Ui, Vi), (Ri, Ui)]:
        with pytest.raises(st.CastError) as e:
            j(a, b, what="init_val[0]")
        assert e.value.code == "SPMD302" and "init_val[0]" in str(e.value)


def test_free_casts_reach_the_join_and_jax_agrees():
    """Every join is reachable from both sides by casts that JAX itself accepts."""
    def body(x):
        for a in all_states():
            for b in all_states():
                try:
                    t = _rules.join_carry(a, b)
                except st.SpmdTypeError:
                    continue
                for side in (a, b):
                    assert st.typeof(_raw_cast(make_raw(x, side), side, t)) == t
    trace_raw(body)


# ----------------------------------------------------------------------------- differential


def test_fori_loop_every_carry_state_pair_differential():
    """For every (initial state, body result state): spmdtyped accepts iff a join exists; the
    cast program it builds is accepted by JAX with the same result state; a rejected pair is
    one JAX rejects too (different carry types) and involves Unreduced, which no JAX cast
    leaves."""
    def body(x):
        for s0 in all_states():
            for s1 in all_states():
                typed = outcome(lambda: st.fori_loop(0, 2, lambda i, c: make(x, s1), make(x, s0)))  # noqa: B023 (called at once)
                if typed[0] == "ok":
                    t = _rules.join_carry(s0, s1)
                    assert st.typeof(typed[1]) == t
                    raw = jax.lax.fori_loop(0, 2, lambda i, c: _raw_cast(make_raw(x, s1), s1, t),  # noqa: B023 (called at once)
                                            _raw_cast(make_raw(x, s0), s0, t))
                    assert st.typeof(raw) == t, (s0, s1)
                else:
                    assert typed == ("spmd", "SPMD302"), (s0, s1, typed)
                    assert s0 != s1 and (s0.unreduced ^ s1.unreduced or s0.unreduced != s1.unreduced)
                    jx = outcome(lambda: jax.lax.fori_loop(0, 2, lambda i, c: make_raw(x, s1),  # noqa: B023 (called at once)
                                                           make_raw(x, s0)))  # noqa: B023 (called at once)
                    assert jx[0] == "jax", (s0, s1)
                    u = next(iter(s0.unreduced ^ s1.unreduced))
                    assert outcome(lambda: jax.lax.pcast(make_raw(x, SpmdType(unreduced=u)), u, to="varying"))[0] == "jax"  # noqa: B023 (called at once)
    trace_raw(body)


@settings(max_examples=25, deadline=None)
@given(hst.lists(hst.sampled_from(SAMPLE), min_size=2, max_size=2),
       hst.lists(hst.sampled_from(SAMPLE), min_size=2, max_size=2))
def test_scan_random_pytree_carries(s0, s1):
    def body(x):
        def step(c, xi):
            return {"a": make(x, s1[0]), "b": (make(x, s1[1]),)}, xi * 2.0
        init = {"a": make(x, s0[0]), "b": (make(x, s0[1]),)}
        typed = outcome(lambda: st.scan(step, init, st.pvary(jnp.ones(3), "j")))
        joins = [outcome(lambda k=k: _rules.join_carry(s0[k], s1[k])) for k in range(2)]
        if all(o[0] == "ok" for o in joins):
            assert typed[0] == "ok", typed
            carry, ys = typed[1]
            assert [st.typeof(carry["a"]), st.typeof(carry["b"][0])] == [o[1] for o in joins]
            assert st.typeof(ys) == Vj
        else:
            assert typed == ("spmd", "SPMD302")
    trace_raw(body)


@settings(max_examples=25, deadline=None)
@given(hst.sampled_from(SAMPLE), hst.sampled_from(SAMPLE), hst.booleans())
def test_cond_random_branch_states(s0, s1, varying_pred):
    def body(x):
        pred = (st.axis_index("i") == 0) if varying_pred else st.wrap(jnp.bool_(True))
        typed = outcome(lambda: st.cond(pred, lambda: make(x, s0), lambda: make(x, s1)))
        want = outcome(lambda: _rules.join_carry(s0, s1))
        if want[0] == "ok" and varying_pred:
            want = outcome(lambda: _rules.join_carry(want[1], want[1].with_states({"i"}, _rules.V)))
        if want[0] == "ok":
            assert typed[0] == "ok" and st.typeof(typed[1]) == want[1]
            t = want[1]
            raw = jax.lax.cond(pred.raw, lambda: _raw_cast(make_raw(x, s0), s0, t),
                               lambda: _raw_cast(make_raw(x, s1), s1, t))
            assert st.typeof(raw) == t
        else:
            assert typed == ("spmd", "SPMD302")
        if s0 != s1:  # JAX alone rejects branches of different types
            assert outcome(lambda: jax.lax.cond(pred.raw, lambda: make_raw(x, s0),
                                                lambda: make_raw(x, s1)))[0] == "jax"
    trace_raw(body)


@settings(max_examples=25, deadline=None)
@given(hst.sampled_from(SAMPLE), hst.sampled_from(SAMPLE), hst.booleans())
def test_while_loop_random_carry_states(s0, s1, varying_cond):
    """The carry joins (s0, s1) and, under a condition varying over i, Varying on i; the cast
    program is accepted by JAX with the same state."""
    def body(x):
        def cond_fun(c):
            n, _ = c
            return n < (st.axis_index("i") + 1 if varying_cond else 2)

        typed = outcome(lambda: st.while_loop(cond_fun, lambda c: (c[0] + 1, make(x, s1)),
                                              (0, make(x, s0))))
        want = outcome(lambda: _rules.join_carry(s0, s1))
        if want[0] == "ok" and varying_cond:
            want = outcome(lambda: _rules.join_carry(want[1], want[1].with_states({"i"}, _rules.V)))
        if want[0] != "ok":
            assert typed == ("spmd", "SPMD302"), typed
            return
        assert typed[0] == "ok", typed
        n, y = typed[1]
        t = want[1]
        assert st.typeof(y) == t
        assert st.typeof(n) == (Vi if varying_cond else I)
        limit = (jax.lax.axis_index("i") + 1) if varying_cond else 2
        pv = (lambda a: jax.lax.pcast(a, "i", to="varying")) if varying_cond else (lambda a: a)
        raw = jax.lax.while_loop(lambda c: c[0] < limit,
                                 lambda c: (c[0] + 1, _raw_cast(make_raw(x, s1), s1, t)),
                                 (pv(0), _raw_cast(make_raw(x, s0), s0, t)))
        assert st.typeof(raw[1]) == t
    trace_raw(body)


# ----------------------------------------------------------------------------- behaviour


def test_fori_loop_auto_pvary_and_retrace_count():
    calls = []

    def body(x):
        v = make(x, Vi)

        def step(i, c):
            calls.append(st.typeof(c))
            return c + v

        out = st.fori_loop(0, 3, step, jnp.zeros(4))
        assert type(out) is st.Varying["i"]
    trace_raw(body)
    assert calls[0] == I and calls[-1] == Vi   # traced on the initial types, widened, retraced


def test_fori_loop_stable_carry_traced_once():
    calls = []

    def body(x):
        def step(i, c):
            calls.append(1)
            return c * 2.0
        st.fori_loop(0, 3, step, make(x, Vi))
    trace_raw(body)
    assert len(calls) == 1


def test_body_output_less_varying_is_cast_on_the_way_out():
    def body(x):
        out = st.fori_loop(0, 2, lambda i, c: st.psum(c, "i"), make(x, Vi))
        assert st.typeof(out) == Vi
    trace_raw(body)


def test_fori_loop_varying_bounds_make_carries_varying():
    def body(x):
        n = st.axis_index("j") + 1
        out = st.fori_loop(0, n, lambda i, c: c + 1.0, jnp.zeros(4))
        assert st.typeof(out) == Vj
    trace_raw(body)


def test_while_loop_varying_condition():
    def body(x):
        limit = st.axis_index("i") * 2
        n = st.while_loop(lambda c: c < limit, lambda c: c + 1, 0)
        assert st.typeof(n) == Vi
        # JAX alone types the same loop Invariant (unsound: the count differs per device)
        raw = jax.lax.while_loop(lambda c: c < limit.raw, lambda c: c + 1, 0)
        assert st.typeof(raw) == I
    trace_raw(body)


def test_while_loop_unreduced_carry_under_varying_condition_is_rejected():
    def body(x):
        u = make(x, Ui)
        with pytest.raises(st.CastError) as e:
            st.while_loop(lambda c: st.axis_index("i") < 1, lambda c: c, u)
        msg = str(e.value)
        assert e.value.code == "SPMD302"
        assert "init_val" in msg and "condition Varying over ['i']" in msg and "Unreduced" in msg
    trace_raw(body)


def test_carry_error_names_pytree_path_states_and_fix():
    def body(x):
        init = (make(x, Vi), {"m": make(x, Ui)})
        with pytest.raises(st.CastError) as e:
            st.fori_loop(0, 2, lambda i, c: (c[0], {"m": st.psum(c[1]["m"], "i")}), init)
        msg = str(e.value)
        assert e.value.code == "SPMD302"
        assert "init_val[1]['m']" in msg
        assert "Unreduced over 'i' before the body but Invariant after the body" in msg
        assert "fix: keep it Unreduced and reduce after: st.psum(result, 'i')" in msg
        assert e.value.axes == ("i",)
    trace_raw(body)


def test_cond_error_names_branch_and_output():
    def body(x):
        with pytest.raises(st.CastError) as e:
            st.cond(True, lambda a: (a, st.pcast(a, "i", to="unreduced")),
                    lambda a: (a, st.psum(a, "i")), make(x, Vi))
        msg = str(e.value)
        assert e.value.code == "SPMD302"
        assert "output[1]" in msg and "in branch 0" in msg and "in branch 1" in msg
    trace_raw(body)


def test_switch_joins_three_branches():
    def body(x):
        out = st.switch(st.wrap(jnp.int32(2)), [lambda a: a, lambda a: st.pcast(a, "i", to="reduced"),
                                                lambda a: st.pvary(a, "j")], jnp.ones(4))
        assert st.typeof(out) == SpmdType(varying="j", reduced="i")
    trace_raw(body)


def test_scan_xs_and_ys_states():
    def body(x):
        xs = make(x, Vj)
        carry, ys = st.scan(lambda c, xi: (c + xi, xi * 2.0), jnp.float32(0.0), xs)
        assert st.typeof(carry) == Vj and st.typeof(ys) == Vj
        carry, ys = st.scan(lambda c, _: (c, c), make(x, Ri), length=2)
        assert st.typeof(carry) == Ri and st.typeof(ys) == Ri and ys.shape == (2, 4)
    trace_raw(body)


def test_unreduced_carry_keeps_its_state():
    def body(x):
        u = make(x, Ui)
        out = st.fori_loop(0, 3, lambda i, c: c + c, u)
        assert st.typeof(out) == Ui
    trace_raw(body)


def test_loops_compute_what_jax_computes():
    m = mesh_ij()
    xs = put(m, jnp.arange(16.0).reshape(2, 8), P(None, ("i", "j")))

    def typed(x):
        x = st.wrap(x)
        acc = st.fori_loop(0, 3, lambda i, c: c * 0.5 + x.sum(0), jnp.zeros(1))
        h, ys = st.scan(lambda c, r: (c + r, c * r), jnp.zeros(1), x)
        w = st.while_loop(lambda c: c.sum() < 10.0, lambda c: c + x[0] + 1.0, jnp.zeros(1))
        b = st.cond(x[0, 0] > 3.0, lambda: x[1] * 2.0, lambda: jnp.ones(1))
        return (acc + h + w + b + ys.sum(0)).raw

    def raw(x):
        pv = lambda a: jax.lax.pcast(a, ("i", "j"), to="varying")  # noqa: E731
        acc = jax.lax.fori_loop(0, 3, lambda i, c: c * 0.5 + x.sum(0), pv(jnp.zeros(1)))
        h, ys = jax.lax.scan(lambda c, r: (c + r, c * r), pv(jnp.zeros(1)), x)
        w = jax.lax.while_loop(lambda c: c.sum() < 10.0, lambda c: c + x[0] + 1.0, pv(jnp.zeros(1)))
        b = jax.lax.cond(x[0, 0] > 3.0, lambda: x[1] * 2.0, lambda: pv(jnp.ones(1)))
        return acc + h + w + b + ys.sum(0)

    spec = P(("i", "j"))
    out_t = jax.jit(jax.shard_map(typed, mesh=m, in_specs=P(None, ("i", "j")), out_specs=spec))(xs)
    out_r = jax.jit(jax.shard_map(raw, mesh=m, in_specs=P(None, ("i", "j")), out_specs=spec))(xs)
    np.testing.assert_array_equal(np.asarray(out_t), np.asarray(out_r))


def test_explain_carry_state_page():
    page = st.explain("SPMD302")
    assert "free cast" in page and "## Example fix" in page
    assert _rules.ELEMENTWISE  # the rule module stays importable without JAX state


# ------------------------------------- jax.lax's control flow on typed values (hints at the step)

#: how each loop is spelled with a typed carry `x` (a hinted argument) and a body `f`
_LAX_LOOPS = {
    "scan": lambda f, x: jax.lax.scan(lambda c, _: (f(c), None), x, None, length=2)[0],
    "fori_loop": lambda f, x: jax.lax.fori_loop(0, 2, lambda i, c: f(c), x),
    "while_loop": lambda f, x: jax.lax.while_loop(lambda c: False, f, x),
    "cond": lambda f, x: jax.lax.cond(True, lambda: f(x), lambda: x),
}
#: the typed spellings that take typed and raw values alike (the fix the message names)
_ST_LOOPS = {
    "scan": lambda f, x: st.scan(lambda c, _: (f(c), None), x, None, length=2)[0],
    "fori_loop": lambda f, x: st.fori_loop(0, 2, lambda i, c: f(c), x),
    "while_loop": lambda f, x: st.while_loop(lambda c: False, f, x),
    "cond": lambda f, x: st.cond(True, lambda: f(x), lambda: x),
}


def _lax_program(loop, body, loops=None, unwrap=False):
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)

    def f(x: st.Varying["dp"], w: st.Varying["tp"]):
        x = st.unwrap(x) if unwrap else x
        return (loops or _LAX_LOOPS)[loop](lambda c: body(c, w), x)
    return st.shard_map(f, mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=P("dp"))


def _loop_line(loop):
    """The line of `_LAX_LOOPS` that calls `loop`: the user's line of the jax.lax call."""
    with open(__file__) as f:
        return next(n for n, text in enumerate(f, 1)
                    if text.startswith(f'    "{loop}": lambda f, x: jax.lax.'))


_X, _W = jnp.arange(12.0).reshape(4, 3) / 10, jnp.arange(32.0).reshape(4, 8) / 40


@pytest.mark.parametrize("loop", sorted(_LAX_LOOPS))
def test_lax_loop_with_a_typed_carry_that_turns_raw_is_explained(loop):
    """`jax.lax.fori_loop(0, n, lambda i, c: jnp.tanh(c), x)` on a hinted `x`: a jnp call on a
    typed value returns a raw one, and JAX compares the carry's pytree structure (a typed value
    is a node around its array): SPMD509 at the loop's line with the two fixes, which run."""
    tanh = lambda c, w: jnp.tanh(c)  # noqa: E731
    with pytest.raises(st.SpmdTypeError) as e:
        _lax_program(loop, tanh)(_X, _W)
    assert e.value.code == "SPMD509", str(e.value)
    assert "st.unwrap(x)" in e.value.fix and "st.fori_loop" in e.value.fix
    assert (e.value.file, e.value.line) == (__file__, _loop_line(loop))
    x = np.asarray(_X)
    want = {"scan": np.tanh(np.tanh(x)), "fori_loop": np.tanh(np.tanh(x)), "while_loop": x,
            "cond": np.tanh(x)}[loop]
    for fixed in (_lax_program(loop, tanh, loops=_ST_LOOPS), _lax_program(loop, tanh, unwrap=True)):
        np.testing.assert_allclose(np.asarray(fixed(_X, _W)), want, rtol=1e-6)


@pytest.mark.parametrize("loop", sorted(_LAX_LOOPS))
def test_lax_loop_whose_typed_carry_changes_state_is_spmd302(loop):
    """The carry comes back typed but Varying over tp too (`c * w.sum()`): JAX sees two
    classes; SPMD302 at the loop's line, the cast and the psum in its fix."""
    with pytest.raises(st.SpmdTypeError) as e:
        _lax_program(loop, lambda c, w: c * w.sum())(_X, _W)
    assert e.value.code == "SPMD302", str(e.value)
    assert "Varying['dp', 'tp']" in str(e.value) and "pcast" in e.value.fix
    assert (e.value.file, e.value.line) == (__file__, _loop_line(loop))
