"""Fault suite of issue 12: one test per defect the adversarial pass found.

Each test failed on main before issue 12 (silently wrong numbers, SPMD901 on valid code, raw
Python/JAX errors, leaks, loops). A test passes when spmdtyped either runs the program with the
single-device reference's numbers or rejects it with an `SpmdTypeError` that has a code.
"""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying, _compat

REPO = Path(__file__).resolve().parent.parent
X = jnp.arange(32.0).reshape(8, 4) / 7.0
REPLICATED = P()


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"))


def _run(mesh, body, *, out_specs=REPLICATED, in_specs=REPLICATED, check_vma=True, arg=X):
    return jax.jit(st.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                                check_vma=check_vma))(arg)


def _unreduced(v):
    """A value Unreduced over 'tp' whose true value (the sum over tp) is `v`, with different
    partials per device: v * (k + 1) / 10 on device k (1 + 2 + 3 + 4 = 10)."""
    share = (st.axis_index("tp") + 1).astype(jnp.float32) / 10.0
    return st.pcast(st.pvary(v, "tp") * share, "tp", to="unreduced")


def _reduced(v):
    return st.pcast(v, "tp", to="reduced")


def _clean_or_equal(mesh, body, reference, **kw):
    """The program runs and matches `reference`, or is rejected with a code; anything else fails."""
    try:
        got = _run(mesh, body, **kw)
    except st.SpmdTypeError as e:
        assert e.code.startswith("SPMD") and e.code != "SPMD901", e
        return e.code
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference), rtol=1e-5, atol=1e-5)
    return None


# ----------------------------------------------------------------- 1. silently wrong on Unreduced

@pytest.mark.parametrize("case", ["pad_constant", "pad_maximum", "pad_minimum", "astype_int",
                                  "astype_bool", "sum_dtype_int"])
def test_1_argument_dependent_linearity_on_unreduced(mesh, case):
    typed = {
        "pad_constant": lambda u: st.numpy.pad(u, 1, constant_values=5.0),
        "pad_maximum": lambda u: st.numpy.pad(u, 1, mode="maximum"),
        "pad_minimum": lambda u: st.numpy.pad(u, 1, "minimum"),
        "astype_int": lambda u: u.astype(jnp.int32),
        "astype_bool": lambda u: u.astype(jnp.bool_),
        "sum_dtype_int": lambda u: st.numpy.sum(u, dtype=jnp.int32),
    }[case]
    with pytest.raises(st.SpmdTypeError) as e:
        _run(mesh, lambda v: st.psum(typed(_unreduced(v)), "tp"))
    assert e.value.code == "SPMD202", e.value
    assert e.value.fix, "the error names a fix"


@pytest.mark.parametrize("case", ["pad_zero", "pad_edge", "pad_reflect", "pad_wrap", "astype_f16",
                                  "sum_dtype_float"])
def test_1_linear_forms_stay_accepted_with_the_right_numbers(mesh, case):
    typed, ref = {
        "pad_zero": (lambda u: st.numpy.pad(u, 1, constant_values=0.0), jnp.pad(X, 1)),
        "pad_edge": (lambda u: st.numpy.pad(u, 1, mode="edge"), jnp.pad(X, 1, mode="edge")),
        "pad_reflect": (lambda u: st.numpy.pad(u, 1, "reflect"), jnp.pad(X, 1, mode="reflect")),
        "pad_wrap": (lambda u: st.numpy.pad(u, 1, mode="wrap"), jnp.pad(X, 1, mode="wrap")),
        "astype_f16": (lambda u: u.astype(jnp.float16).astype(jnp.float32), X),
        "sum_dtype_float": (lambda u: st.numpy.sum(u, axis=0, dtype=jnp.float32), X.sum(0)),
    }[case]
    if case in ("pad_zero", "pad_reflect") and _compat.FEATURES.pad_value_state:
        # jax 0.12.1 rejects both (an Invariant padding value; rev has no Unreduced rule):
        # spmdtyped says so first
        with pytest.raises(st.SpmdTypeError, match="jax 0.12.1 cannot compute") as e:
            _run(mesh, lambda v: st.psum(typed(_unreduced(v)), "tp"))
        assert e.value.code == "SPMD202" and e.value.fix
        return
    got = _run(mesh, lambda v: st.psum(typed(_unreduced(v)), "tp"))
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=2e-3, atol=2e-3)


# ----------------------------------------------------------------- 2. secondary array arguments

def _tp_index():
    return st.axis_index("tp")


_SECONDARY = {
    "at_set_index": (lambda v: v.at[_tp_index()].set(1.0),
                     lambda x, k: x.at[k].set(1.0)),
    "at_add_index": (lambda v: v.at[_tp_index()].add(1.0),
                     lambda x, k: x.at[k].add(1.0)),
    "roll_shift": (lambda v: st.numpy.roll(v, _tp_index(), axis=0),
                   lambda x, k: jnp.roll(x, k, axis=0)),
    "pad_constant_values": (lambda v: st.numpy.pad(v, 1, constant_values=_tp_index().astype(jnp.float32)),
                            lambda x, k: jnp.pad(x, 1, constant_values=jnp.float32(k))),
    "linspace_bounds": (lambda v: st.numpy.linspace(_tp_index().astype(jnp.float32), 5.0, 4) + v[0],
                        lambda x, k: jnp.linspace(jnp.float32(k), 5.0, 4) + x[0]),
    "softmax_where": (lambda v: st.nn.softmax(v, where=st.pvary(v, "tp") > _tp_index()),
                      lambda x, k: jax.nn.softmax(x, where=x > k)),
    "logsumexp_b": (lambda v: st.nn.logsumexp(v, axis=1, b=st.pvary(v, "tp") + _tp_index()),
                    lambda x, k: jax.nn.logsumexp(x, axis=1, b=x + k)),
}


@pytest.mark.parametrize("case", sorted(_SECONDARY))
def test_2_secondary_argument_state_joins_result(mesh, case):
    typed, ref = _SECONDARY[case]
    # the result depends on the device's tp index: Varying over tp, so it leaves through a tp
    # dimension, stacked; each block matches the single-device reference at that index
    out = _run(mesh, lambda v: st.numpy.expand_dims(typed(v), 0), out_specs=P("tp"))
    out = np.asarray(out)
    for k in range(4):
        np.testing.assert_allclose(out[k], np.asarray(ref(X, k)), rtol=1e-5, atol=1e-5)
    # through P() the Varying result is rejected (not SPMD901, not one device's value)
    for check_vma in (True, False):
        with pytest.raises(st.SpmdTypeError) as e:
            _run(mesh, typed, out_specs=P(), check_vma=check_vma)
        assert e.value.code == "SPMD401", e.value


def test_2_reduced_indexed_with_an_index_array(mesh):
    idx = jnp.array([0, 3, 1])

    def body(v):
        return st.pcast(_reduced(v)[idx], "tp", to="varying")

    code = _clean_or_equal(mesh, lambda v: st.numpy.expand_dims(body(v), 0), np.stack([X[idx]] * 4),
                           out_specs=P("tp"))
    assert code is None, code


# ----------------------------------------------------------------- 3. accepted, then fails at execution

_REDUCED_OPS = {
    "sort": (lambda r: st.numpy.sort(r, axis=0), lambda x: jnp.sort(x, axis=0)),
    "cumprod": (lambda r: st.numpy.cumprod(r, axis=0), lambda x: jnp.cumprod(x, axis=0)),
    "sigmoid": (lambda r: st.nn.sigmoid(r), jax.nn.sigmoid),
    "silu": (lambda r: st.nn.silu(r), jax.nn.silu),
}


@pytest.mark.parametrize("case", sorted(_REDUCED_OPS))
def test_3_accepted_reduced_ops_lower_and_run(mesh, case):
    typed, ref = _REDUCED_OPS[case]

    def body(v):
        y = typed(_reduced(v))
        return st.numpy.expand_dims(st.pcast(y, "tp", to="varying") if "tp" in st.typeof(y).reduced
                                    else st.pvary(y, "tp"), 0)

    # lowered, compiled and run (jax.jit executes), compared with the single-device reference
    _clean_or_equal(mesh, body, np.stack([np.asarray(ref(X))] * 4), out_specs=P("tp"))


# ----------------------------------------------------------------- 4. Python protocols never hang or lie

def _bounded(fn, seconds=20.0):
    """Run fn in a thread; fail if it does not finish (a protocol loop) within `seconds`."""
    box: dict[str, object] = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - reported below
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), "a Python protocol on a typed value did not finish (infinite loop)"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box.get("value")


def test_4_protocols_do_not_hang_or_lie(mesh):
    seen = {}

    def body(v):
        x = st.pvary(v[:3, 0], "dp")            # shape (3,), Varying over dp
        # iteration ends after len(x) items (or is refused with a code): never more
        try:
            seen["iter"] = len(list(itertools.islice(iter(x), 10)))
        except (st.SpmdTypeError, TypeError) as e:
            seen["iter"] = e
        # bool() of a non-scalar array raises (JAX raises): `assert zeros == ones` cannot pass
        try:
            bool(x == x + 1.0)
            seen["bool"] = "passed"
        except (st.SpmdTypeError, TypeError, jax.errors.ConcretizationTypeError, ValueError) as e:
            seen["bool"] = e
        # unpacking: exactly len(x) items
        try:
            a, b, c = x
            seen["unpack"] = (st.typeof(a), st.typeof(c))
        except (st.SpmdTypeError, TypeError, ValueError) as e:
            seen["unpack"] = e
        try:
            seen["contains"] = 1.0 in x
        except (st.SpmdTypeError, TypeError, jax.errors.ConcretizationTypeError) as e:
            seen["contains"] = e
        return st.psum(x, "dp")

    _bounded(lambda: _run(mesh, body))
    assert seen["iter"] == 3 or isinstance(seen["iter"], Exception), seen
    assert seen["bool"] != "passed", "bool() of a non-scalar typed array lied"
    # unpacking gives exactly three items (an endless iterator makes it raise ValueError)
    assert not isinstance(seen["unpack"], ValueError), seen
    if isinstance(seen["iter"], st.SpmdTypeError):
        assert seen["iter"].code.startswith("SPMD")


# ----------------------------------------------------------------- 5. leaks and misroutes

def test_5_pbroadcast_multi_character_axis(mesh):
    f = st.shard_map(lambda v: st.pbroadcast(st.pvary(v, "dp"), "dp", 0), mesh=mesh,
                     in_specs=P(), out_specs=P("dp"))
    out = jax.eval_shape(f, X)   # JAX has no CPU lowering for pbroadcast: trace only
    assert out.shape == (16, 4)


def test_5_psum_over_a_vmap_axis(mesh):
    per_row = jax.vmap(lambda r: st.psum(r, "rows").raw, axis_name="rows")
    # outside shard_map: as jax.lax.psum
    np.testing.assert_allclose(np.asarray(per_row(X)), np.broadcast_to(X.sum(0), X.shape), rtol=1e-5)

    def body(v):
        w = st.pvary(v, "dp")                     # typed values go through jax.vmap as pytrees
        summed = jax.vmap(lambda r: st.psum(r, "rows"), axis_name="rows")(w)
        assert st.typeof(summed) == st.typeof(w)  # a vmap axis leaves the mesh states alone
        return st.psum(summed, "dp")

    # check_vma=False: JAX binds it; the numbers match the single-device reference
    out = _run(mesh, body, check_vma=False)
    np.testing.assert_allclose(np.asarray(out), np.broadcast_to(2 * X.sum(0), X.shape), rtol=1e-5)
    # check_vma=True: JAX fails with a bare AssertionError; spmdtyped names the limitation
    with pytest.raises(st.SpmdTypeError) as e:
        _run(mesh, body)
    assert e.value.code == "SPMD503" and "vmap" in str(e.value)


def test_5_custom_op_outside_shard_map():
    op = st.custom_op(lambda a: a * 2.0, requires={"dp": "varying"})
    out = op(X)
    np.testing.assert_allclose(np.asarray(st.unwrap(out)), np.asarray(X * 2.0))


def test_5_registered_dataclass_output_is_raw(mesh):
    @jax.tree_util.register_dataclass
    @dataclasses.dataclass
    class Out:
        a: jax.Array
        b: jax.Array

    out = st.shard_map(lambda v: Out(v, st.numpy.tanh(v)), mesh=mesh, in_specs=P(),
                       out_specs=P())(X)
    assert type(out.a) is type(X) and type(out.b) is type(X), (type(out.a), type(out.b))
    np.testing.assert_allclose(np.asarray(out.b), np.asarray(jnp.tanh(X)), rtol=1e-6)


# ----------------------------------------------------------------- 6. Python errors from inside

@pytest.mark.parametrize("case", ["div_zero", "mean_zero_size", "sum_initial_unreduced",
                                  "sum_initial_reduced", "pad_linear_ramp_unreduced",
                                  "complex_literal_reduced"])
def test_6_no_raw_python_or_jax_errors(mesh, case):
    body, ref = {
        "div_zero": (lambda v: st.psum(_unreduced(v) / 0.0, "tp"), None),
        "mean_zero_size": (lambda v: st.psum(_unreduced(v[:0]).mean(axis=0), "tp"),
                           jnp.mean(X[:0], axis=0)),
        "sum_initial_unreduced": (lambda v: st.psum(st.numpy.sum(_unreduced(v), initial=1.0), "tp"),
                                  None),
        "sum_initial_reduced": (lambda v: st.pcast(st.numpy.sum(_reduced(v), initial=1.0), "tp",
                                                   to="varying")[None],
                                np.full((4,), float(X.sum() + 1.0))),
        "pad_linear_ramp_unreduced": (lambda v: st.psum(st.numpy.pad(_unreduced(v), 1,
                                                                     mode="linear_ramp"), "tp"),
                                      jnp.pad(X, 1, mode="linear_ramp")),
        "complex_literal_reduced": (lambda v: st.pcast(_reduced(v) * 1j, "tp", to="varying"),
                                    np.concatenate([np.asarray(X * 1j)] * 4, axis=1)),
    }[case]
    kw = {"out_specs": P("tp")} if case in ("sum_initial_reduced",) else {}
    if case == "complex_literal_reduced":
        kw = {"out_specs": P(None, "tp")}
    if ref is None:
        with pytest.raises(st.SpmdTypeError) as e:
            _run(mesh, body, **kw)
        assert e.value.code.startswith("SPMD") and e.value.code != "SPMD901"
    else:
        _clean_or_equal(mesh, body, ref, **kw)


def test_6_custom_op_requires_as_a_list():
    with pytest.raises(st.SpmdTypeError) as e:
        st.custom_op(lambda a: a, requires=["dp"])
    assert e.value.code == "SPMD507"


def test_6_explain_takes_an_int():
    assert st.explain(101).startswith("# SPMD101")


def test_6_wrap_checks_the_state_it_is_given(mesh):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(mesh, lambda v: st.wrap(v.raw, st.SpmdType(varying={"tp"})), out_specs=P(None, "tp"))
    assert e.value.code == "SPMD504"
    with pytest.raises(st.SpmdTypeError) as e:
        _run(mesh, lambda v: st.wrap(v.raw, "varying"))
    assert e.value.code == "SPMD504"


# ----------------------------------------------------------------- boundary: specs against hints

def test_5_in_specs_checked_against_parameter_hints(mesh):
    def f(x: Varying["dp"]) -> Invariant:
        return st.psum(x, "dp")

    with pytest.raises(st.SpmdTypeError) as e:
        jax.jit(st.shard_map(f, mesh=mesh, in_specs=(P("tp"),), out_specs=P()))(X)
    assert e.value.code == "SPMD403" and "hint" in str(e.value) and "'tp'" in str(e.value)


def test_5_out_specs_checked_against_the_return_hint(mesh):
    def f(x: Varying["dp"]) -> Varying["dp"]:
        return st.psum(x, "dp")   # Invariant at runtime; the hint promises Varying over dp

    with pytest.raises(st.SpmdTypeError) as e:
        jax.jit(st.shard_map(f, mesh=mesh, in_specs=(P("dp"),), out_specs=P()))(X)
    assert e.value.code == "SPMD401" and "hint" in str(e.value)

    # hints that fit: accepted (Varying['dp'] param from P('dp'); Invariant result through P())
    def ok(x: Varying["dp"]) -> Invariant:
        return st.psum(x, "dp")

    xs = jax.device_put(X, jax.sharding.NamedSharding(mesh, P("dp")))
    # summing the two dp blocks elementwise is what this program means (a stack of per-device
    # terms, not slices of one array): the Shard refinement's SPMD108 is opted out
    with st.allow("SPMD108"):
        out = jax.jit(st.shard_map(ok, mesh=mesh, in_specs=(P("dp"),), out_specs=P()))(xs)
    np.testing.assert_allclose(np.asarray(out), np.asarray(X[:4] + X[4:]), rtol=1e-6)


# ----------------------------------------------------------------- 7. the plugin

_PLUGIN_SRC = '''
import functools
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P
import spmdtyped as st
import spmdtyped.lax
from spmdtyped import Varying, Unreduced, Reduced, Invariant


@st.custom_op(requires={"tp": "varying"}, produces={"tp": "invariant"})
def ring(a: jax.Array) -> jax.Array:
    return a


def use_custom(r: Reduced["tp"]) -> None:
    ring(r)  # E: spmd-custom-op-requires


def opq(u: Unreduced["tp"]) -> None:
    st.opaque(jnp.tanh)(u)  # E: spmd-nonlinear-unreduced


def lax_typed(r: Reduced["tp"]) -> None:
    spmdtyped.lax.psum(r, "tp")  # E: spmd-reduced-operand


def part(r: Reduced["tp"]) -> None:
    f = functools.partial(st.psum, axis_name="tp")
    f(r)  # E: spmd-reduced-operand


def jitted(u: Unreduced["tp"]) -> None:
    jax.jit(st.numpy.tanh)(u)  # E: spmd-nonlinear-unreduced


mesh = jax.make_mesh((2, 4), ("dp", "tp"))


@st.shard_map(mesh=mesh, in_specs=(P("tp"),), out_specs=P())  # E: spmd-in-spec
def bad_in(x: Varying["dp"]) -> Invariant:
    return st.psum(x, "dp")


@st.shard_map(mesh=mesh, in_specs=(P("dp"),), out_specs=P())
def bad_out(x: Varying["dp"]) -> Varying["dp"]:
    return x


def call_bad_out(x: Varying["dp"]) -> None:
    bad_out(x)  # E: spmd-out-spec-state


def through_names(r: Reduced["tp"], u: Unreduced["tp"]) -> None:
    g = jax.jit(st.numpy.tanh)
    g(u)  # E: spmd-nonlinear-unreduced
    h = functools.partial(st.psum, axis_name="tp")
    h(r)  # E: spmd-reduced-operand
    op = st.custom_op(jnp.sin, requires={"tp": "varying"})
    st.opaque(jnp.sin)(r)
    st.custom_op(jnp.sin, requires={"tp": "varying"})(r)  # E: spmd-custom-op-requires
    del op


def fine(x: Varying["dp"], u: Unreduced["tp"], v: Varying["tp"]) -> None:
    x.at[0].set(1.0)
    Fam = Varying
    del Fam
    st.psum(u, "tp")
    ring(v)
    jax.jit(st.numpy.tanh)(x)
    functools.partial(st.psum, axis_name="tp")(v)
    spmdtyped.lax.psum(v, "tp")
'''


def test_7_plugin_sees_what_the_runtime_rejects(tmp_path):
    from test_typing import CACHE, mypy_config, mypy_errors, run_mypy

    src = tmp_path / "plugin_faults.py"
    src.write_text(textwrap.dedent(_PLUGIN_SRC))
    want = {(src.name, n, line.split("# E: ")[1].strip())
            for n, line in enumerate(src.read_text().splitlines(), 1) if "# E: " in line}
    _rc, out = run_mypy([src], mypy_config(tmp_path, plugin=True), CACHE / "plugin", cwd=tmp_path)
    got = {k for k in mypy_errors(out)}
    assert got == want, f"missing: {sorted(want - got)}\nextra: {sorted(got - want)}\n{out}"


def test_7_pyproject_unquoted_version_is_no_internal_error(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        "[tool.mypy]\nplugins = ['spmdtyped.mypy_plugin']\n\n[tool.spmdtyped]\njax = 0.12\n")
    (tmp_path / "m.py").write_text("import spmdtyped as st\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "m.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert "INTERNAL ERROR" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
