"""The refinement walk of `infer` (adapters/_refine_walk.py) on small raw programs: loops and
branches, opaque computations, routed autodiff, and the idioms it accepts (module docstring).

The bug classes themselves are in tests/test_bug_suite.py (each reported at its `# BUG` line).
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import spmdtyped as st


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


def _line(f, marker):
    src, start = inspect.getsourcelines(f)
    return start + next(i for i, t in enumerate(src) if marker in t)


def _codes(rep):
    return [(v.code, getattr(v, "line", None)) for v in rep.violations]


def test_a_partial_carried_through_scan_then_a_bias_is_reported(mesh):
    """The carry's refinement reaches a fixed point: a Partial accumulator stays Partial
    through the loop, and adding a replicated bias to it after the loop is SPMD210."""
    def f(h, w, b):
        def step(acc, _):
            return acc + h @ w, None                  # contraction over the tp shard: Partial
        zero = lax.pcast(jnp.zeros((2, 8)), ("dp", "tp"), to="varying")   # zero: any partial sum
        acc, _ = lax.scan(step, h @ w + zero, None, length=3)
        y = acc + b  # the bias
        return lax.psum(y, "tp")

    rep = st.adapters.infer(f, jnp.ones((4, 16)), jnp.ones((16, 8)), jnp.ones((8,)), mesh=mesh,
                            in_specs=(P("dp", "tp"), P("tp", None), P()), out_specs=P("dp"))
    assert ("SPMD210", _line(f, "the bias")) in _codes(rep), _codes(rep)


def test_a_carry_that_stops_being_partial_is_plain(mesh):
    """A carry Partial at the start and plain after one iteration joins to plain: no error."""
    def f(h, w, b):
        def step(acc, _):
            return jnp.tanh(acc) * 0.0 + h @ w * jnp.exp(acc), None
        acc, _ = lax.scan(step, h @ w, None, length=2)
        return lax.psum(acc + b, "tp")

    rep = st.adapters.infer(f, jnp.ones((4, 16)), jnp.ones((16, 8)), jnp.ones((8,)), mesh=mesh,
                            in_specs=(P("dp", "tp"), P("tp", None), P()), out_specs=P("dp"))
    assert "SPMD210" not in [c for c, _ in _codes(rep)]


def test_raw_while_loop_on_a_varying_condition_is_spmd303(mesh):
    def f(x):
        n = lax.axis_index("tp")
        out = lax.while_loop(lambda c: c[1] < n, lambda c: (c[0] * 2.0, c[1] + 1), (x, 0))  # here
        return out[0][None]

    rep = st.adapters.infer(f, jnp.float32(1.0), mesh=mesh, in_specs=P(), out_specs=P("tp"))
    assert ("SPMD303", _line(f, "# here")) in _codes(rep), _codes(rep)


def test_cond_on_varying_operands_is_accepted(mesh):
    def f(x):
        x = lax.pcast(x, "tp", to="varying")
        y = lax.cond(lax.axis_index("tp") == 0, lambda v: 2 * v, lambda v: 3 * v, x)
        return y[None]

    assert st.adapters.infer(f, jnp.float32(1.0), mesh=mesh, in_specs=P(), out_specs=P("tp")).ok


def test_an_unknown_primitive_gives_plain_not_an_error(mesh):
    """eigh of a Partial Gram matrix: the Partial meets an op without a rule -> plain."""
    def f(g):
        w, _ = jnp.linalg.eigh(g.T @ g)
        return w

    rep = st.adapters.infer(f, jnp.ones((16, 4)), mesh=mesh, in_specs=P("tp", None),
                            out_specs=P("tp"))
    assert rep.ok, _codes(rep)


def test_a_callback_cast_back_to_varying_is_accepted(mesh):
    def f(g, x):
        y = jax.pure_callback(np.matmul, jax.ShapeDtypeStruct(x.shape[:1], x.dtype), x, g,
                              vmap_method="sequential")
        y = lax.pcast(y, "dp", to="varying")
        return lax.psum((y * y).sum(), "dp")

    assert st.adapters.infer(f, jnp.ones(8), jnp.ones((8, 8)), mesh=mesh,
                             in_specs=(P(), P("dp")), out_specs=P()).ok


def test_a_nonlinear_partial_used_only_by_pmax_is_accepted_and_otherwise_reported(mesh):
    def per_shard(g):
        return lax.pmax(jnp.sqrt(jnp.sum(g * g)), "tp")

    def global_norm(g):
        n = jnp.sqrt(jnp.sum(g * g))  # norm
        return g / n

    ok = st.adapters.infer(per_shard, jnp.ones((16, 8)), mesh=mesh, in_specs=P("tp", None),
                           out_specs=P())
    assert ok.ok
    bad = st.adapters.infer(global_norm, jnp.ones((16, 8)), mesh=mesh, in_specs=P("tp", None),
                            out_specs=P("tp", None))
    assert ("SPMD211", _line(global_norm, "# norm")) in _codes(bad)


def test_gradient_of_a_rep_parameter_is_partial_through_routed_grad(mesh):
    """The routed grad types cotangents by the rule: the gradient of a pcast (Rep) parameter
    is Partial, so dividing by it is SPMD212 (and the numbers are untouched)."""
    def f(w, x):
        g = jax.grad(lambda w: jnp.sum(jnp.tanh(x @ w)))(lax.pcast(w, "dp", to="varying"))
        return x / jnp.sum(g)  # divide

    rep = st.adapters.infer(f, jnp.ones((8,)), jnp.ones((4, 8)), mesh=mesh,
                            in_specs=(P(), P("dp")), out_specs=P("dp"))
    assert ("SPMD212", _line(f, "# divide")) in _codes(rep), _codes(rep)


def test_checked_gradient_program_is_jaxs(mesh):
    """A gradient in the body is read from the jaxpr JAX traced: `jax.grad` is JAX's own while
    `typed_shard_map` and `infer` trace it, and the checked program lowers to the raw one."""
    grad, vjp, vg = jax.grad, jax.vjp, jax.value_and_grad
    seen = []

    def body(w, x):
        seen.append((jax.grad, jax.vjp, jax.value_and_grad) == (grad, vjp, vg))
        return jax.grad(lambda w: jnp.sum(jnp.sin(x @ w)))(w)   # JAX sums it over dp

    w, x = jnp.arange(8.0) / 8, jnp.ones((4, 8))
    raw = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P()))
    typed = jax.jit(st.adapters.typed_shard_map(body, mesh=mesh, in_specs=(P(), P("dp")),
                                                out_specs=P()))
    assert typed.lower(w, x).as_text() == raw.lower(w, x).as_text()
    st.adapters.infer(body, w, x, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P())
    np.testing.assert_allclose(typed(w, x), raw(w, x), rtol=1e-6)
    assert seen and all(seen)


def test_collectives_give_shards_and_reps(mesh):
    """psum_scatter of a Partial is Shard (a sharded bias adds to it), all_gather of that Shard
    is Rep; a replicated bias laid along the scattered dim is SPMD215."""
    def ok(h, w, b):
        y = lax.psum_scatter(h @ w, "tp", scatter_dimension=1, tiled=True) + b
        return lax.all_gather(y, "tp", axis=1, tiled=True)

    def bad(h, w, c):
        y = lax.psum_scatter(h @ w, "tp", scatter_dimension=1, tiled=True)
        return lax.all_gather(y + c, "tp", axis=1, tiled=True)  # replicated along the shard

    args = (jnp.ones((4, 16)), jnp.ones((16, 8)))
    specs = (P("dp", "tp"), P("tp", None))
    assert st.adapters.infer(ok, *args, jnp.ones((8,)), mesh=mesh, in_specs=(*specs, P("tp")),
                             out_specs=P("dp", "tp")).ok
    rep = st.adapters.infer(bad, *args, jnp.ones((2,)), mesh=mesh, in_specs=(*specs, P()),
                            out_specs=P("dp", "tp"))
    assert ("SPMD215", _line(bad, "replicated along")) in _codes(rep), _codes(rep)
