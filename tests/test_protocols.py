"""Typed values behave like `jax.Array` for Python, NumPy and the rest of JAX (issue 14, items 1-2)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import put
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

ROOT = Path(__file__).resolve().parents[1]


def _in_shard_map(mesh, body, x, spec=None):
    spec = P("dp") if spec is None else spec
    out = {}

    def f(v):
        out["v"] = body(v)
        return v

    st.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec)(put(mesh, x, spec))
    return out["v"]


# ------------------------------------------------------------------ Python / NumPy protocols


def test_len_iteration_unpacking_and_index_error():
    x = st.wrap(jnp.arange(6.0).reshape(3, 2))
    assert len(x) == 3
    rows = list(x)
    assert len(rows) == 3 and all(st.typeof(r) == st.typeof(x) for r in rows)
    np.testing.assert_array_equal(np.asarray(rows[2]), [4.0, 5.0])
    a, b = st.wrap(jnp.array([1.0, 2.0]))
    assert float(a) == 1.0 and float(b) == 2.0
    with pytest.raises(ValueError, match="too many values to unpack"):
        a, b = x
    with pytest.raises(IndexError, match="out of bounds"):
        x[3]
    with pytest.raises(IndexError, match="axis 1"):
        x[0, -3]
    assert float(x[-1, -1]) == 5.0
    with pytest.raises(TypeError, match="unsized"):
        len(st.wrap(jnp.float32(1.0)))
    with pytest.raises(TypeError, match="0-d"):
        iter(st.wrap(jnp.float32(1.0)))


def test_scalar_conversions_outside_tracing():
    one = st.wrap(jnp.float32(1.0))
    zero = st.wrap(jnp.float32(0.0))
    assert bool(one) is True and bool(zero) is False
    assert float(one) == 1.0 and int(st.wrap(jnp.int32(3))) == 3
    assert [10, 20, 30][st.wrap(jnp.int32(2))] == 30  # __index__
    assert complex(one) == 1 + 0j
    with pytest.raises(ValueError, match="ambiguous"):
        bool(st.wrap(jnp.ones(3)))


def test_numpy_asarray_outside_tracing():
    x = st.wrap(jnp.arange(4.0))
    arr = np.asarray(x)
    assert isinstance(arr, np.ndarray) and arr.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert np.asarray(x, dtype=np.int32).dtype == np.int32
    np.testing.assert_array_equal(np.array(x), arr)


def test_bool_and_float_under_tracing_raise_jax_errors(mesh_dp_tp):
    def body(v):
        with pytest.raises(jax.errors.TracerBoolConversionError):
            bool(v[0, 0] > 0)  # (v.sum() of a dp shard is a partial sum: SPMD211 first)
        with pytest.raises(jax.errors.ConcretizationTypeError):
            float(v.sum())
        with pytest.raises(jax.errors.TracerArrayConversionError):
            np.asarray(v)
        return True

    assert jax.jit(lambda x: _in_shard_map(mesh_dp_tp, body, x) and x)(jnp.ones((8, 4))) is not None


def test_repr_shows_state_and_local_shape(mesh_dp_tp):
    r = _in_shard_map(mesh_dp_tp, repr, jnp.ones((8, 4)))
    # an input sharded over dp is a Shard of the global array (its refinement is shown)
    assert r.startswith("Shard['dp', -2](local float32[4,4]"), r
    assert repr(st.wrap(jnp.ones(3))) == "Invariant(local float32[3], concrete)"


def test_print_in_an_eager_body_shows_each_devices_values():
    """JAX's tutorial debugs an eager shard_map by printing from the body: JAX prints each
    device's block. A typed value there prints its state and, after it, what JAX prints (the
    check's trace first prints it as traced, once)."""
    mesh = jax.make_mesh((2,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    printed: list[str] = []

    @st.shard_map(mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    def f(x: Varying["i"]) -> Varying["i"]:
        printed.append(str(x))
        return x * 2

    np.testing.assert_array_equal(np.asarray(f(jnp.arange(6.0))), np.arange(6.0) * 2)
    traced, eager = printed
    assert traced == "Shard['i', -1](local float32[3], traced)"
    head, *devices = eager.split("\n")
    assert head == "Shard['i', -1](local float32[3], eager):"
    assert "[0. 1. 2.]" in devices and "[3. 4. 5.]" in devices, eager


_BOUNDED = textwrap.dedent("""
    import os
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    import spmdtyped as st
    x = st.wrap(jnp.arange(12.0).reshape(4, 3))
    assert np.asarray(x).shape == (4, 3)
    assert len([row for row in x]) == 4
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    seen = []
    def body(v):
        seen.append(len([row for row in v]))
        return v
    st.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=P("dp"))(
        jax.device_put(jnp.ones((8, 3)), NamedSharding(mesh, P("dp"))))
    # (the first eager call traces the body for the check, then runs it as JAX does)
    assert seen and set(seen) == {4}, seen
    print("ok")
""")


def test_asarray_and_iteration_end_in_bounded_time():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _BOUNDED], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


# ------------------------------------------------------------------ the rest of JAX


def test_jnp_nn_and_lax_accept_typed_values_and_keep_the_state(mesh_dp_tp):
    def body(v):
        outs = {
            "jnp.tanh": jnp.tanh(v),
            "jnp.cumsum": jnp.cumsum(v, axis=1),
            "jnp.where": jnp.where(v > 0, v, 0.0),
            "jax.nn.gelu": jax.nn.gelu(v),
            "lax.exp": jax.lax.exp(v),
            "lax.dot_general": jax.lax.dot_general(v, v.T, (((1,), (0,)), ((), ()))),
            "jnp.asarray": jnp.asarray(v),
        }
        return {k: (st.typeof(o), np.shape(o)) for k, o in outs.items()}

    got = _in_shard_map(mesh_dp_tp, body, jnp.ones((8, 4)))
    for name, (t, _shape) in got.items():
        assert t == st.SpmdType(varying={"dp"}), name
    assert got["lax.dot_general"][1] == (4, 4)


def test_plain_jax_results_feed_typed_collectives(mesh_dp_tp):
    def f(x):
        h = jnp.tanh(x)  # a raw JAX value, Varying over dp in JAX's own type
        return st.psum(jnp.sum(h), "dp")

    x = jnp.linspace(-1.0, 1.0, 32).reshape(8, 4)
    out = st.shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P())(put(mesh_dp_tp, x, P("dp")))
    np.testing.assert_allclose(float(out), float(jnp.sum(jnp.tanh(x))), atol=1e-5)


@pytest.mark.parametrize("fn,name", [
    (lambda u: jnp.cumsum(u), "st.numpy.cumsum"),
    (lambda u: jnp.where(jnp.ones(u.shape, bool), u, 0.0), "st.numpy.where"),
    (lambda u: jnp.tanh(u), "st.numpy.tanh"),
    (lambda u: jax.nn.relu(u), "st.nn.relu"),
])
def test_plain_jax_on_unreduced_names_the_typed_replacement(mesh_dp_tp, fn, name):
    def body(v):
        u = st.pcast(st.pvary(v, "tp"), "tp", to="unreduced")
        with pytest.raises(st.SpmdTypeError) as ei:
            fn(u)
        return ei.value

    err = _in_shard_map(mesh_dp_tp, body, jnp.ones((8, 4)), spec=P())
    assert err.code == "SPMD202"
    assert name in str(err) and "st.psum(u, 'tp')" in str(err), str(err)


def test_lax_on_unreduced_refuses(mesh_dp_tp):
    def body(v):
        u = st.pcast(st.pvary(v, "tp"), "tp", to="unreduced")
        with pytest.raises(TypeError) as ei:
            jax.lax.exp(u)
        return ei.value

    err = _in_shard_map(mesh_dp_tp, body, jnp.ones((8, 4)), spec=P())
    spmd = err if isinstance(err, st.SpmdTypeError) else err.__cause__
    assert isinstance(spmd, st.SpmdTypeError) and spmd.code == "SPMD202", repr(err)


def test_plain_jax_refuses_a_state_it_cannot_track_under_check_vma_false(mesh_dp_tp):
    def body(v):
        with pytest.raises(st.SpmdTypeError, match="check_vma=False") as ei:
            jnp.tanh(v)
        return ei.value.code

    out = {}

    def f(v):
        out["code"] = body(v)
        return v

    st.shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"), check_vma=False)(
        put(mesh_dp_tp, jnp.ones((8, 4)), P("dp")))
    assert out["code"] == "SPMD202"


def test_jax_grad_of_a_typed_scalar_matches_the_reference(mesh_dp_tp):
    def loss(w, x):
        return jnp.mean(jnp.tanh(x @ w) ** 2)

    def f(w, x):
        # the loss is Varying over dp: its gradient w.r.t. the Invariant w is summed over dp
        g = jax.grad(lambda w: loss(w, x) / 2)(w)
        return g

    w = jnp.linspace(-1, 1, 12).reshape(4, 3)
    x = jnp.linspace(-2, 2, 32).reshape(8, 4)
    g = st.shard_map(f, mesh=mesh_dp_tp, in_specs=(P(), P("dp")), out_specs=P())(
        put(mesh_dp_tp, w), put(mesh_dp_tp, x, P("dp")))
    np.testing.assert_allclose(np.asarray(g), np.asarray(jax.grad(loss)(w, x)), rtol=1e-5, atol=1e-6)


def test_raw_operator_typed_uses_the_typed_rules(mesh_dp_tp):
    def body(v):
        u = st.pcast(st.pvary(v, "tp"), "tp", to="unreduced")
        s = u.raw + u          # raw Unreduced + typed Unreduced: linear, stays Unreduced
        d = v.raw * v          # raw Invariant * typed Invariant
        return type(s), type(d), type(v.raw == v)

    got = _in_shard_map(mesh_dp_tp, body, jnp.ones((8, 4)), spec=P())
    assert got[0] is st.Unreduced["tp"] and got[1] is st.Invariant and got[2] is st.Invariant
