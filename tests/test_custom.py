"""Custom typed ops: st.custom_op declarations and st.opaque, checked against JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import SAMPLE, I, Ri, Ui, Vi, Vj, make, make_raw, mesh_ij, outcome, put, trace_raw
from hypothesis import given, settings
from hypothesis import strategies as hst
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import SpmdType, _rules

V_, U_, R_ = _rules.V, _rules.U, _rules.R


@st.custom_op(requires={"i": "varying"}, produces={"i": "invariant"})
def ring_allreduce(x):
    """A hand-written all-reduce over i (2 devices): x + ppermute(x)."""
    return x + jax.lax.ppermute(x, "i", [(0, 1), (1, 0)])


def test_custom_rule_union_and_produces():
    f = _rules.custom_op_type
    assert f([Vi, I], [{}, {}]) == Vi
    assert f([Ri, Vj], [{}, {}]) == SpmdType(varying="j", reduced="i")
    assert f([Ri, Vi], [{}, {}]) == Vi
    assert f([Vi], [{"i": V_}], {"i": _rules.I}) == I
    assert f([Ui, Ri], [{"i": U_}, {}]) == Ui
    assert f([Vi], [{"i": V_}], {"i": U_}) == Ui
    with pytest.raises(st.CombineError) as e:
        f([Ui], [{}], op="st.opaque(k)")
    assert e.value.code == "SPMD202" and "not declared to take partial sums" in str(e.value)
    with pytest.raises(st.CombineError) as e:
        f([Ui, Vi], [{"i": U_}, {}])
    assert e.value.code == "SPMD201"
    with pytest.raises(st.AxisStateError) as e:
        f([I], [{"i": V_}], op="st.custom_op(k)")
    assert e.value.code == "SPMD107" and "fix: st.pvary(x, 'i')" in str(e.value)


def test_declared_collective_result_is_cast_and_numerically_right():
    m = mesh_ij()
    xs = put(m, jnp.arange(8.0), P(("i", "j")))

    def typed(x):
        y = ring_allreduce(st.wrap(x))
        # JAX types the ppermute result Varying; the declaration makes it Invariant over i
        assert type(y) is st.Varying["j"]
        return st.psum(y, "j").raw

    def raw(x):
        return jax.lax.psum(jax.lax.psum(x, "i"), "j")

    run = lambda fn: jax.jit(jax.shard_map(fn, mesh=m, in_specs=P(("i", "j")), out_specs=P()))  # noqa: E731
    with pytest.raises(st.InternalConsistencyError) as e:
        run(typed)(xs)
    # ppermute's result really is Varying for JAX: no free cast makes it Invariant
    assert e.value.code == "SPMD902" and "Varying over 'i'" in str(e.value)

    @st.custom_op(requires={"i": "varying"}, produces={"i": "invariant"})
    def allreduce(x):
        return jax.lax.psum(x, "i")

    def typed_ok(x):
        y = allreduce(st.wrap(x))
        assert type(y) is st.Varying["j"]
        return st.psum(y, "j").raw

    np.testing.assert_array_equal(np.asarray(run(typed_ok)(xs)), np.asarray(run(raw)(xs)))


def test_declared_partial_sums_become_unreduced():
    @st.custom_op(requires={"x": {"i": "varying"}}, produces={"i": "unreduced"})
    def local_matmul(x, w):
        return x * w

    def body(x0):
        u = local_matmul(make(x0, Vi), jnp.ones(4))
        assert type(u) is st.Unreduced["i"] and st.typeof(u.raw) == Ui  # cast in JAX too
        assert type(st.psum(u, "i")) is st.Invariant
    trace_raw(body)


def test_requires_per_parameter():
    @st.custom_op(requires={"x": {"i": "varying"}, "w": {"i": "reduced"}})
    def kernel(x, w):
        return x * w

    def body(x0):
        y = kernel(make(x0, Vi), make(x0, Ri))
        assert type(y) is st.Varying["i"]
        with pytest.raises(st.AxisStateError) as e:
            kernel(make(x0, Vi), w=make(x0, I))
        assert e.value.code == "SPMD107" and "w is Invariant over 'i'" in str(e.value)
    trace_raw(body)


def test_produces_callable():
    @st.custom_op(produces=lambda a, b: SpmdType(varying=a.varying | b.varying | {"j"}))
    def kernel(a, b):
        return jax.lax.pcast(a + b, "j", to="varying")

    def body(x0):
        assert type(kernel(jnp.ones(4), jnp.ones(4))) is st.Varying["j"]
    trace_raw(body)


def test_opaque_defaults_and_errors():
    def body(x0):
        y = st.opaque(lambda a, b: a * b)(make(x0, Vi), make(x0, Vj))
        assert type(y) is st.Varying["i", "j"]
        with pytest.raises(st.CombineError) as e:
            st.opaque(lambda a: a, name="kern")(make(x0, Ui))
        msg = str(e.value)
        assert e.value.code == "SPMD202" and "st.opaque(kern)" in msg
        assert "requires={'i': 'unreduced'}" in msg
        with pytest.raises(st.InternalConsistencyError) as e:
            st.opaque(lambda a: a + jax.lax.axis_index("j"), name="noisy")(jnp.ones(4))
        msg = str(e.value)
        assert e.value.code == "SPMD902" and "JAX types the result Varying over 'j'" in msg
        assert "produces={'j': 'varying'}" in msg
        with st.allow("SPMD202"):   # the strict rule's opt-out
            st.opaque(lambda a: a)(make(x0, Ui))
    trace_raw(body)


def test_malformed_declarations():
    with pytest.raises(st.UsageError) as e:
        st.custom_op(requires={"i": "vary"})(lambda x: x)
    assert e.value.code == "SPMD507" and "fix: requires={'i': 'varying'}" in str(e.value)
    with pytest.raises(st.UsageError) as e:
        st.custom_op(requires={"y": {"i": "varying"}})(lambda x: x)
    assert e.value.code == "SPMD507" and "parameter 'y'" in str(e.value)
    with pytest.raises(st.UsageError) as e:
        st.custom_op(requires={"x": {"i": "varying"}, "i": "varying"})(lambda x: x)
    assert e.value.code == "SPMD507"
    with pytest.raises(st.UsageError) as e:
        st.custom_op(produces=["i"])(lambda x: x)
    assert e.value.code == "SPMD507"

    def body(x0):
        with pytest.raises(st.UsageError) as e:
            st.custom_op(requires={"k": "varying"})(lambda x: x)(x0)
        assert e.value.code == "SPMD501"
    trace_raw(body)


@settings(max_examples=30, deadline=None)
@given(hst.sampled_from(SAMPLE), hst.sampled_from(SAMPLE))
def test_opaque_differential(s0, s1):
    """An opaque elementwise product: accepted -> the union; JAX computes that state too
    (after the free casts), except where spmdtyped is strict (Unreduced)."""
    def body(x0):
        got = outcome(lambda: st.opaque(lambda a, b: a * b)(make(x0, s0), make(x0, s1)))
        if got[0] == "ok":
            assert not (s0.unreduced or s1.unreduced)
            assert st.typeof(got[1]) == st.typeof(got[1].raw)
            assert st.typeof(got[1]).varying >= s0.varying | s1.varying
        elif got[1] == "SPMD202":
            assert s0.unreduced or s1.unreduced
        else:
            # the raw function itself is rejected by JAX, or the union needs a cast JAX lacks
            assert got[0] == "jax" or got[1] in ("SPMD201", "SPMD902"), got
    trace_raw(body)


def test_custom_op_outside_shard_map_just_runs():
    y = st.opaque(lambda a: a * 2.0)(jnp.ones(3))
    assert type(y) is st.Invariant
    np.testing.assert_array_equal(np.asarray(y.raw), 2.0 * np.ones(3))


def test_explain_new_codes():
    for code in ("SPMD107", "SPMD507", "SPMD902"):
        page = st.explain(code)
        assert page.startswith(f"# {code}: ") and "## Solutions" in page
    assert make_raw is not None
