"""The engine walks a nested jaxpr that many equations share (a jitted helper called once per
layer, `jax.nn.relu`'s jit) once per refinement of its operands: a helper walked clean with
one refinement must still report the bug it computes with another (the memo is keyed by the
operands' refinements and facts, and a walk that reported is never memoized), and the lineage
a nested walk records is mapped back to the caller's inputs.

Raw JAX bodies (jnp, a `jax.jit` helper, `jax.lax.psum`), run under `typed_shard_map` and
`infer`; the fixed program equals a single-device reference in values and gradients.
"""

from __future__ import annotations

import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped._engine.check import shard_map_eqn
from spmdtyped._engine.refine_walk import check_program


@jax.jit
def add_bias(y: jax.Array, b: jax.Array) -> jax.Array:
    return y + b


SPECS = (P(), P(None, "tp"), P("tp", None), P(None, "tp"), P("tp"), P())
OUT = (P(), P(None, "tp"))


def buggy(x: Any, x_sh: Any, w_row: Any, w_col: Any, b_col: Any, b: Any) -> Any:
    ok = add_bias(x @ w_col, b_col)   # a column-parallel output plus its bias slice: clean
    bad = add_bias(x_sh @ w_row, jax.lax.pcast(b, "tp", to="varying"))   # bias before the psum
    return jax.lax.psum(bad, "tp"), ok


def fixed(x: Any, x_sh: Any, w_row: Any, w_col: Any, b_col: Any, b: Any) -> Any:
    ok = add_bias(x @ w_col, b_col)
    good = jax.lax.psum(x_sh @ w_row, "tp") + b
    return good, ok


def _args(mesh: Any) -> tuple[Any, ...]:
    rng = np.random.default_rng(0)
    shapes = [(4, 32), (4, 32), (32, 8), (32, 32), (32,), (8,)]
    return tuple(jax.device_put(jnp.asarray(rng.normal(size=s), jnp.float32),
                                NamedSharding(mesh, spec)) for s, spec in zip(shapes, SPECS, strict=True))


@pytest.fixture(scope="module")
def mesh() -> Any:
    return jax.make_mesh((2, 4), ("dp", "tp"))


def test_a_helper_walked_clean_still_reports_its_bug_with_other_operands(mesh: Any) -> None:
    args = _args(mesh)
    rep = st.adapters.infer(buggy, *args, mesh=mesh, in_specs=SPECS, out_specs=OUT)
    assert [v.code for v in rep.violations] == ["SPMD210"]
    lines, first = inspect.getsourcelines(add_bias.__wrapped__)
    at = first + next(i for i, text in enumerate(lines) if "return" in text)
    assert (rep.violations[0].file, rep.violations[0].line) == (__file__, at)
    step = st.adapters.typed_shard_map(buggy, mesh=mesh, in_specs=SPECS, out_specs=OUT)
    with pytest.raises(st.SpmdTypeError, match="SPMD210"):
        jax.jit(step).lower(*args)


def test_a_shared_helper_is_walked_once_per_refinement(mesh: Any) -> None:
    def twice(x: Any, x_sh: Any, w_row: Any, w_col: Any, b_col: Any, b: Any) -> Any:
        return add_bias(x @ w_col, b_col) + add_bias(x @ w_col * 2.0, b_col), b

    args = _args(mesh)
    closed = jax.make_jaxpr(jax.shard_map(twice, mesh=mesh, in_specs=SPECS,
                                          out_specs=(P(None, "tp"), P())))(*args)
    found: list[Any] = []
    walk = check_program(shard_map_eqn(closed), ("dp", "tp"), mesh,
                         lambda e, where, extra: found.append(e))
    assert found == []
    # the two calls share one jaxpr and one refinement of their operands: one walk of it
    assert len(walk.calls) == 1


def test_the_fixed_program_equals_one_device(mesh: Any) -> None:
    args = _args(mesh)
    step = jax.jit(st.adapters.typed_shard_map(fixed, mesh=mesh, in_specs=SPECS, out_specs=OUT))
    got, ok = step(*args)
    x, x_sh, w_row, w_col, b_col, b = (np.asarray(a) for a in args)
    np.testing.assert_allclose(got, x_sh @ w_row + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ok, x @ w_col + b_col, rtol=1e-5, atol=1e-5)

    def loss(*a: Any) -> Any:
        good, col = step(*a)
        return jnp.sum(good ** 2) + jnp.sum(jnp.sin(col))

    def reference(x: Any, x_sh: Any, w_row: Any, w_col: Any, b_col: Any, b: Any) -> Any:
        return jnp.sum((x_sh @ w_row + b) ** 2) + jnp.sum(jnp.sin(x @ w_col + b_col))

    with jax.set_mesh(mesh):
        grads = jax.grad(loss, argnums=tuple(range(6)))(*args)
    want = jax.grad(reference, argnums=tuple(range(6)))(*(jnp.asarray(np.asarray(a)) for a in args))
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-4)



@jax.custom_jvp
def add_bias_jvp(y: jax.Array, b: jax.Array) -> jax.Array:
    return y + b


add_bias_jvp.defjvp(lambda primals, tangents: (add_bias_jvp(*primals), tangents[0] + tangents[1]))


def layers(x: Any, x_sh: Any, w_row: Any, w_col: Any, b_col: Any, b: Any, *, bug_at: int | None
           ) -> Any:
    """Four layers, each through the custom_jvp helper (JAX traces its body anew at every
    call: four nested jaxprs equal in all but identity); at `bug_at`, the replicated bias is
    added to a row-parallel partial sum inside it, before the psum."""
    h = x @ w_col
    out = []
    for i in range(4):
        # one line for both calls: the clean one (a column-parallel output plus its bias
        # slice) and the buggy one differ in their operands' refinements only
        y, bias = (x_sh @ w_row, jax.lax.pcast(b, "tp", to="varying")) if i == bug_at \
            else (h, b_col)
        z = add_bias_jvp(y, bias)
        if i == bug_at:
            out.append(jax.lax.psum(z, "tp"))
        else:
            h = z
            out.append(jax.lax.psum(x_sh @ w_row, "tp") + b)
    return sum(out), h


def test_a_helper_traced_anew_at_each_call_is_walked_once(mesh: Any) -> None:
    args = _args(mesh)
    closed = jax.make_jaxpr(jax.shard_map(lambda *a: layers(*a, bug_at=None), mesh=mesh,
                                          in_specs=SPECS, out_specs=OUT))(*args)
    eqn = shard_map_eqn(closed)
    body = eqn.params["jaxpr"]
    calls = [e.params["call_jaxpr"] for e in getattr(body, "jaxpr", body).eqns
             if e.primitive.name == "custom_jvp_call"]
    assert len(calls) == 4 and len({id(c) for c in calls}) == 4   # four jaxprs, one shape
    found: list[Any] = []
    walk = check_program(eqn, ("dp", "tp"), mesh, lambda e, where, extra: found.append(e))
    assert found == []
    assert len(walk.calls) == 1


@pytest.mark.parametrize("bug_at", [0, 3])
def test_a_helper_traced_anew_reports_the_layer_that_has_the_bug(mesh: Any, bug_at: int) -> None:
    args = _args(mesh)

    def step(*a: Any) -> Any:
        return layers(*a, bug_at=bug_at)

    rep = st.adapters.infer(step, *args, mesh=mesh, in_specs=SPECS, out_specs=OUT)
    assert [v.code for v in rep.violations] == ["SPMD210"]
    lines, first = inspect.getsourcelines(add_bias_jvp.fun)
    at = first + next(i for i, text in enumerate(lines) if "return" in text)
    assert (rep.violations[0].file, rep.violations[0].line) == (__file__, at)
    with pytest.raises(st.SpmdTypeError, match="SPMD210"):
        jax.jit(st.adapters.typed_shard_map(step, mesh=mesh, in_specs=SPECS, out_specs=OUT)
                ).lower(*args)
    # the fixed layers compute the one-device numbers
    got, h = jax.jit(st.adapters.typed_shard_map(lambda *a: layers(*a, bug_at=None), mesh=mesh,
                                                 in_specs=SPECS, out_specs=OUT))(*args)
    x, x_sh, w_row, w_col, b_col, b = (np.asarray(a) for a in args)
    np.testing.assert_allclose(got, 4 * (x_sh @ w_row + b), rtol=1e-4, atol=1e-4)
    # (the bug is real: the bias is counted once per tp device)
    bad, _ = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=SPECS, out_specs=OUT))(*args)
    np.testing.assert_allclose(bad - got, np.broadcast_to(3 * b, got.shape), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(h, x @ w_col + 4 * b_col, rtol=1e-5, atol=1e-5)


def test_the_fixed_layers_gradient_equals_one_device(mesh: Any) -> None:
    """The gradient taken through the checked program (the custom_jvp helper's own rule, once
    per layer, each walked from the one shape) equals a single device's."""
    args = _args(mesh)
    step = st.adapters.typed_shard_map(lambda *a: layers(*a, bug_at=None), mesh=mesh,
                                       in_specs=SPECS, out_specs=OUT)

    def loss(*a: Any) -> Any:
        out, h = step(*a)
        return jnp.sum(out ** 2) + jnp.sum(jnp.tanh(h))

    def reference(x: Any, x_sh: Any, w_row: Any, w_col: Any, b_col: Any, b: Any) -> Any:
        return jnp.sum((4 * (x_sh @ w_row + b)) ** 2) + jnp.sum(jnp.tanh(x @ w_col + 4 * b_col))

    with jax.set_mesh(mesh):
        grads = jax.jit(jax.grad(loss, argnums=tuple(range(6))))(*args)
    want = jax.grad(reference, argnums=tuple(range(6)))(*(jnp.asarray(np.asarray(a)) for a in args))
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-3)


def test_a_check_leaves_no_cyclic_garbage(mesh: Any) -> None:
    """Everything a check builds is freed by reference counting when it ends: a reference
    cycle (a closure stored on a walk, a recursive helper holding the views) would keep the
    walks' memos and views alive until a collection during the lowering, which then traverses
    them (docs/performance.md §2). Such a cycle holds one of the engine's objects (a walk,
    its views, an equation's view): the garbage is read for objects of spmdtyped's own
    classes, and for the functions and bound methods of its modules. (Other garbage can turn
    up in the window when the test shares its process with others: once, in a full run under
    xdist, JAX's DebugInfo objects and tracers of earlier tests' traces.)"""
    import gc

    from spmdtyped._engine.check import check_staged

    args = _args(mesh)
    closed = jax.make_jaxpr(jax.shard_map(lambda *a: layers(*a, bug_at=None), mesh=mesh,
                                          in_specs=SPECS, out_specs=OUT))(*args)
    buggy_closed = jax.make_jaxpr(jax.shard_map(lambda *a: layers(*a, bug_at=2), mesh=mesh,
                                                in_specs=SPECS, out_specs=OUT))(*args)
    check_staged(closed, where="test")   # module-level caches filled once
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert check_staged(closed, where="test") == []
        assert [v.code for v in check_staged(buggy_closed, where="test")] == ["SPMD210"]
        gc.collect()
        garbage = [_describe(o) for o in gc.garbage if _ours(o)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert garbage == []


def _ours(o: Any) -> bool:
    """An object of spmdtyped's: an instance of one of its classes, or one of its functions or
    bound methods (a closure stored on a walk)."""
    fn = getattr(o, "__func__", o)
    module = getattr(fn, "__module__", None) if callable(fn) and hasattr(fn, "__code__") \
        else type(o).__module__
    return isinstance(module, str) and module.startswith("spmdtyped")


def _describe(o: Any) -> str:
    return f"{type(o).__module__}.{type(o).__qualname__}"
