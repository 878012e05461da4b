"""`spmdtyped.lax`: a drop-in for jax.lax's collectives that checks states on raw values."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import sds, trace
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.lax as slax
from spmdtyped._typed.array import is_typed


@pytest.mark.parametrize("name", slax.CHECKED)
def test_signatures_match_jax_lax(name):
    ours = inspect.signature(getattr(slax, name)).parameters
    theirs = inspect.signature(getattr(jax.lax, name)).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == \
        [(p.name, p.kind, p.default) for p in theirs.values()]


def test_other_names_are_jax_lax():
    assert slax.scan is jax.lax.scan and slax.dot_general is jax.lax.dot_general
    assert slax.fori_loop is jax.lax.fori_loop
    assert "scan" in dir(slax) and "psum" in dir(slax)
    with pytest.raises(AttributeError):
        slax.no_such_function  # noqa: B018
    assert not hasattr(slax, "__path__")
    assert st.lax is slax
    from spmdtyped.adapters._port import scan as _codemod_scan
    assert tuple(sorted(_codemod_scan.CHECKED)) == tuple(sorted(slax.CHECKED))


def _program(lax):
    def f(x, w, r):
        a = lax.psum(x @ w, "tp")
        b = lax.pmean(x, "dp")
        c = lax.pmax(x, "dp") + lax.pmin(x, "dp")
        d = lax.ppermute(x, "dp", [(0, 1), (1, 0)]) + lax.pshuffle(x, "dp", [1, 0])
        g = lax.all_gather(x, "dp", tiled=True)
        gi = lax.all_gather(x, "dp", axis=1, tiled=True, to="invarying")
        s = lax.psum_scatter(x @ w, "tp", scatter_dimension=1, tiled=True)
        t = lax.all_to_all(x @ w, "tp", 1, 1, tiled=True)
        u = lax.psum(lax.pcast(x, "dp", to="unreduced"), "dp")
        rv = lax.pcast(r, "tp", to="varying")
        i = lax.axis_index(("dp", "tp"))
        n = lax.axis_size("tp") + lax.psum(1, "dp")
        tree = lax.psum({"p": x @ w, "q": [x @ w]}, "tp")
        outs = (a, b, c, d, g, gi, s, t, u, rv * i * n, tree["p"] + tree["q"][0])
        return tuple(o.sum()[None] for o in outs)
    return f


SPECS = ((P("dp"), P(None, "tp"), P(reduced={"tp"})), (P(("dp", "tp")),) * 11)


def test_program_identical_to_jax_lax(mesh_dp_tp):
    """The drop-in binds exactly the primitives jax.lax binds (same jaxpr), and runs."""
    args = (sds(mesh_dp_tp, (4, 8), P("dp")), sds(mesh_dp_tp, (8, 16), P(None, "tp")),
            sds(mesh_dp_tp, (8,), P(reduced={"tp"})))
    ours = trace(mesh_dp_tp, _program(slax), *SPECS, args=args, smap=jax.shard_map)
    theirs = trace(mesh_dp_tp, _program(jax.lax), *SPECS, args=args, smap=jax.shard_map)
    assert str(ours.jaxpr) == str(theirs.jaxpr)


def test_numbers_identical_to_jax_lax(mesh_dp_tp):
    x = jax.device_put(jnp.arange(32.0).reshape(4, 8), NamedSharding(mesh_dp_tp, P("dp")))
    w = jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh_dp_tp, P(None, "tp")))

    def f(lax):
        return lambda x, w: (lax.psum(x @ w, "tp"), lax.pmean(x, "dp"),
                             lax.ppermute(x, "dp", [(0, 1), (1, 0)]))

    specs = dict(mesh=mesh_dp_tp, in_specs=(P("dp"), P(None, "tp")), out_specs=(P("dp"), P(), P("dp")))
    for a, b in zip(jax.shard_map(f(slax), **specs)(x, w), jax.shard_map(f(jax.lax), **specs)(x, w),
                    strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_results_are_raw_pytrees(mesh_dp_tp):
    seen = []

    def f(x):
        out = slax.psum({"a": x, "b": (x, x)}, "dp")
        seen.extend(jax.tree_util.tree_leaves(out, is_leaf=is_typed))
        assert set(out) == {"a", "b"} and isinstance(out["b"], tuple)
        return out["a"]

    trace(mesh_dp_tp, f, (P("dp"),), P(), args=(sds(mesh_dp_tp, (4,), P("dp")),), smap=jax.shard_map)
    assert len(seen) == 3 and not any(is_typed(v) for v in seen)


def test_passthrough_outside_shard_map():
    # a vmap axis: jax.lax semantics, no manual mesh -> no checks
    out = jax.vmap(lambda v: slax.psum(v, "b"), axis_name="b")(jnp.arange(4.0))
    np.testing.assert_array_equal(out, jnp.full(4, 6.0))
    out = jax.vmap(lambda v: slax.axis_index("b"), axis_name="b")(jnp.arange(3.0))
    np.testing.assert_array_equal(out, jnp.arange(3))


def test_passthrough_with_check_vma_false(mesh_dp_tp):
    def f(x):
        return slax.psum(x, "tp")  # every value is Invariant without check_vma: JAX's psum

    f_smap = jax.shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"), check_vma=False)
    j_smap = jax.shard_map(lambda x: jax.lax.psum(x, "tp"), mesh=mesh_dp_tp, in_specs=P("dp"),
                           out_specs=P("dp"), check_vma=False)
    arg = sds(mesh_dp_tp, (4,), P("dp"))
    assert str(jax.make_jaxpr(f_smap)(arg)) == str(jax.make_jaxpr(j_smap)(arg))


def test_axis_size_idiom_passes(mesh_dp_tp):
    def f(x):
        return x * slax.psum(1, "tp") + slax.axis_size("dp")

    trace(mesh_dp_tp, f, (P("dp"),), P("dp"), args=(sds(mesh_dp_tp, (4,), P("dp")),), smap=jax.shard_map)


@pytest.mark.parametrize("body,spec,code,fragment", [
    (lambda x: slax.psum(slax.all_gather(x, "dp", tiled=True, to="reduced"), "dp"), P("dp"),
     "SPMD101", "Reduced"),
    (lambda x: slax.ppermute(slax.pcast(x, "dp", to="unreduced"), "dp", [(0, 1), (1, 0)]),
     P("dp"), "SPMD102", "Unreduced"),
    (lambda x: slax.psum(slax.psum(x, "dp"), "dp"), P("dp"), "SPMD103", "already Invariant"),
    (lambda x: slax.pmean(x, "tp"), P("dp"), "SPMD103", "already Invariant"),
    (lambda x: slax.all_gather(x, "tp"), P("dp"), "SPMD103", "all_gather"),
    (lambda x: slax.psum(x, ("dp", "tp")), P("dp"), "SPMD104", "differs between the named axes"),
    (lambda x: slax.pcast(x, "dp", to="varying"), P("dp"), "SPMD301", "cannot cast"),
    (lambda x: slax.psum(x, "dq"), P("dp"), "SPMD501", "did you mean 'dp'"),
    (lambda x: slax.psum(x, ["dp"]), P("dp"), "SPMD502", "list"),
    (lambda x: slax.psum(x, "dp", axis_index_groups=[[0, 1]]), P("dp"), "SPMD502",
     "axis_index_groups"),
    (lambda x: slax.all_gather(x, "dp", to="everywhere"), P("dp"), "SPMD505", "to="),
])
def test_errors_before_jax(mesh_dp_tp, body, spec, code, fragment):
    with pytest.raises(st.SpmdTypeError) as ei:
        trace(mesh_dp_tp, body, (spec,), P(), args=(sds(mesh_dp_tp, (8,), spec),), smap=jax.shard_map)
    assert ei.value.code == code
    assert fragment in str(ei.value)


def test_strict_opt_out_gives_jax_semantics(mesh_dp_tp):
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh_dp_tp, P("dp")))

    def f(x):
        with st.allow("SPMD103"):
            return slax.psum(x, "tp")  # x is Invariant on tp: JAX multiplies by 4

    out = jax.shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"))(x)
    np.testing.assert_array_equal(np.asarray(out), 4 * np.arange(8.0))
