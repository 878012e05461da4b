"""Typed ports of the control-flow and autodiff bug classes of tests/bugs/ (10, 11, 12).

Each class is written with spmdtyped (`st.cond`, `st.grad` under `jax.vmap`, `st.opaque`) and
its gradient compared with the single-device `reference` of the bug module:

- 10 `cond_axis_index_grad` (jax#40823): the buggy program, typed, computes RIGHT: `st.cond`
  varies the Invariant operand on the predicate's axes before the branch.
- 11 `per_example_grads_vmap` (jax#36886): the buggy program raises SPMD407 at the bug line;
  the fixed one matches the reference.
- 12 `custom_kernel_replicated_grad` (jax-finufft#226): the buggy program, typed, computes
  RIGHT: `st.opaque` casts the replicated input and the kernel's outputs and cotangents.
"""

from __future__ import annotations

import inspect

import bugs
import bugs.cond_axis_index_grad as cond_bug
import bugs.custom_kernel_replicated_grad as kernel_bug
import bugs.per_example_grads_vmap as vmap_bug
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import spmdtyped as st

RTOL = ATOL = 1e-5
MIN_ERROR = 1e-2


def _close(got, want):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=RTOL, atol=ATOL)


def _far(got, want):
    assert float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) > MIN_ERROR


# ----------------------------------------------------------------------------- class 10


def _cond_typed(x):
    # the buggy body written with spmdtyped: the same cond, same operand
    y = st.cond(st.axis_index("tp") == 0, lambda x: 2 * x, lambda x: 3 * x, x)
    return y[None]


def _cond_grad(body):
    fwd = st.shard_map(body, mesh=cond_bug.mesh, in_specs=cond_bug.IN_SPECS,
                       out_specs=cond_bug.OUT_SPECS)
    return jax.jit(jax.grad(lambda x: fwd(x).sum())), jax.jit(fwd)


def test_class10_typed_cond_gives_the_reference_gradient():
    (x,) = cond_bug.make_inputs()
    grad, fwd = _cond_grad(_cond_typed)
    want = cond_bug.reference(x)
    assert float(want) == 23.0
    _close(grad(x), want)                              # 23, not JAX's 16
    _far(cond_bug.buggy(x), want)                      # the raw program: 16
    # the forward values are the raw program's
    raw_fwd = jax.jit(jax.shard_map(cond_bug.buggy_body, mesh=cond_bug.mesh,
                                    in_specs=cond_bug.IN_SPECS, out_specs=cond_bug.OUT_SPECS))
    np.testing.assert_array_equal(np.asarray(fwd(x)), np.asarray(raw_fwd(x)))


def test_class10_typed_switch_and_closure_free_operands():
    """st.switch on a varying index: every device's branch, gradient from the reference."""
    (x,) = cond_bug.make_inputs()

    def body(x):
        k = st.axis_index("tp") % 3
        y = st.switch(k, [lambda x: 2 * x, lambda x: 3 * x, lambda x: x * x], x)
        return y[None]

    grad, _ = _cond_grad(body)

    def ref(x):
        return sum([2 * x, 3 * x, x * x][d % 3] for d in range(8))

    _close(grad(x), jax.grad(ref)(x))


def test_class10_typed_cond_keeps_an_invariant_predicate_invariant():
    """A uniform predicate casts nothing: outputs stay Invariant (no pvary, no psum)."""
    seen = {}

    def body(x):
        y = st.cond(x > 0, lambda x: 2 * x, lambda x: 3 * x, x)
        seen["t"] = st.typeof(y)
        return y[None]

    fwd = st.shard_map(body, mesh=cond_bug.mesh, in_specs=cond_bug.IN_SPECS,
                       out_specs=jax.sharding.PartitionSpec())
    jaxpr = jax.make_jaxpr(fwd)(jnp.float32(2.0))
    assert seen["t"] == st.SpmdType()
    assert "pvary" not in str(jaxpr) and "pcast" not in str(jaxpr)


def test_class10_fixed_matches_the_reference():
    (x,) = cond_bug.make_inputs()
    _close(cond_bug.fixed(x), cond_bug.reference(x))


# ----------------------------------------------------------------------------- class 11


def _net(p, x):
    return st.numpy.sin(st.numpy.dot(p, x))


def _vmap_buggy(params, xs):
    return jax.vmap(st.grad(_net), in_axes=(None, 0))(params, xs)   # the bug line, typed


def _vmap_fixed(params, xs):
    params = st.pcast(params, "dp", to="varying")
    return jax.vmap(st.grad(_net), in_axes=(None, 0))(params, xs)


def _vmap_run(body):
    return jax.jit(st.shard_map(body, mesh=vmap_bug.mesh, in_specs=vmap_bug.IN_SPECS,
                                out_specs=vmap_bug.OUT_SPECS))


def test_class11_typed_buggy_raises_spmd407_at_the_bug_line():
    inputs = vmap_bug.make_inputs()
    with pytest.raises(st.BoundaryError) as info:
        _vmap_run(_vmap_buggy).trace(*inputs)
    assert info.value.code == "SPMD407"
    # the innermost user frame of the traceback is the vmap(st.grad) line of _vmap_buggy
    src, start = inspect.getsourcelines(_vmap_buggy)
    frames = [f for f in inspect.getinnerframes(info.tb) if f.filename == __file__]
    assert frames and frames[-1].lineno == start + 1
    _far(vmap_bug.buggy(*inputs), vmap_bug.reference(*inputs))   # the raw program is wrong


def test_class11_typed_fixed_matches_the_reference():
    inputs = vmap_bug.make_inputs()
    _close(_vmap_run(_vmap_fixed)(*inputs), vmap_bug.reference(*inputs))
    _close(vmap_bug.fixed(*inputs), vmap_bug.reference(*inputs))


# ----------------------------------------------------------------------------- class 12


@jax.custom_vjp
def _opaque_kernel(g, x):
    """`x @ g` as an opaque kernel (host callbacks forward and backward, as an FFI kernel):
    written without any state handling; st.opaque supplies it."""
    out = jax.ShapeDtypeStruct(x.shape[:1], jnp.float32)
    return jax.pure_callback(kernel_bug._matvec_host, out, g, x, vmap_method="sequential")


def _opaque_fwd(g, x):
    return _opaque_kernel(g, x), (g, x)


def _opaque_bwd(res, ct):
    g, x = res
    ct_g = jax.pure_callback(kernel_bug._matvec_t_host, jax.ShapeDtypeStruct(g.shape, jnp.float32),
                             x, ct, vmap_method="sequential")
    return ct_g, ct[:, None] * g[None, :]


_opaque_kernel.defvjp(_opaque_fwd, _opaque_bwd)


def _kernel_typed(g, x):
    # the buggy body written with spmdtyped: the kernel called on Invariant g, Varying x
    return st.psum((st.opaque(_opaque_kernel)(g, x) ** 2).sum(), "dp")


def test_class12_typed_opaque_kernel_gives_the_reference_gradient():
    g, x = kernel_bug.make_inputs()
    seen = {}

    def body(g, x):
        y = st.opaque(_opaque_kernel)(g, x)
        seen["y"] = st.typeof(y)
        return _kernel_typed(g, x)

    fwd = st.shard_map(body, mesh=kernel_bug.mesh, in_specs=kernel_bug.IN_SPECS,
                       out_specs=kernel_bug.OUT_SPECS)
    want = kernel_bug.reference(g, x)
    _close(jax.jit(jax.grad(fwd))(g, x), want)
    assert seen["y"] == st.SpmdType(varying="dp")
    _close(jax.jit(fwd)(g, x), jnp.sum((x @ g) ** 2))
    _far(kernel_bug.buggy(g, x), want)                   # the raw program is wrong


def test_class12_typed_st_grad_inside_the_body():
    """The same through st.grad inside the shard_map: the gradient is Invariant and right."""
    g, x = kernel_bug.make_inputs()

    def body(g, x):
        grad = st.grad(lambda g: _kernel_typed(g, x))(g)
        assert st.typeof(grad) == st.SpmdType()
        return grad

    got = jax.jit(st.shard_map(body, mesh=kernel_bug.mesh, in_specs=kernel_bug.IN_SPECS,
                               out_specs=kernel_bug.OUT_SPECS))(g, x)
    _close(got, kernel_bug.reference(g, x))


def test_class12_the_raw_kernel_without_casts_is_rejected_by_jax():
    """Why the cast of cotangents is needed: the same kernel called raw (no st.opaque) on
    Invariant g and Varying x fails JAX's custom_vjp check (the callback types ct_x Invariant),
    which is what led jax-finufft to cast by hand and lose the reduction."""
    g, x = kernel_bug.make_inputs()

    def body(g, x):
        y = _opaque_kernel(g, x)
        return lax.psum(jnp.sum(lax.pcast(y, "dp", to="varying") ** 2), "dp")

    f = jax.shard_map(body, mesh=kernel_bug.mesh, in_specs=kernel_bug.IN_SPECS,
                      out_specs=kernel_bug.OUT_SPECS)
    with pytest.raises(ValueError, match="Custom VJP bwd rule"):
        jax.jit(jax.grad(f))(g, x)


def test_class12_fixed_matches_the_reference():
    g, x = kernel_bug.make_inputs()
    _close(kernel_bug.fixed(g, x), kernel_bug.reference(g, x))


def test_flow_classes_are_in_the_suite():
    assert {"cond_axis_index_grad", "per_example_grads_vmap",
            "custom_kernel_replicated_grad"} <= set(bugs.BUG_CLASSES)


def test_class10_typed_cond_closing_over_a_differentiated_invariant_is_spmd303():
    """The closure form of class 10: x is not an operand, so it cannot be cast; under grad
    that is SPMD303 (not JAX's silent 16). Forward-only it computes right and is accepted."""
    (x,) = cond_bug.make_inputs()

    def body(x):
        y = st.cond(st.axis_index("tp") == 0, lambda: 2 * x, lambda: 3 * x)
        return y[None]

    fwd = st.shard_map(body, mesh=cond_bug.mesh, in_specs=cond_bug.IN_SPECS,
                       out_specs=cond_bug.OUT_SPECS)
    with pytest.raises(st.CastError) as info:
        jax.jit(jax.grad(lambda x: fwd(x).sum())).trace(x)
    assert info.value.code == "SPMD303" and "pass it as an operand" in str(info.value)
    want = np.array([2 * x] + [3 * x] * 7)
    np.testing.assert_allclose(np.asarray(jax.jit(fwd)(x)), want)
