"""Nothing in JAX is replaced while spmdtyped checks a program (issue 27, item 2): every face
(`st.shard_map`, `typed_shard_map`, `checking(step)`, `infer`) traces the body with JAX's own
`jax.grad` / `jax.value_and_grad` / `jax.vjp` / `jax.shard_map` / `jax.lax.*`, the gradients
are read from the jaxpr, and a library that bound those functions at import time
(`eqx.filter_value_and_grad`) is checked all the same. The one hook that stays is
`_compat.hook_grad_vjp` (`jax.grad` of a typed loss: JAX offers no public way), installed once
at import; the package's source touches no other JAX module attribute."""

from __future__ import annotations

import ast
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

PKG = pathlib.Path(st.__file__).parent

#: the JAX names a body may call, and their identity before any check
WATCHED = {"jax.grad": lambda: jax.grad, "jax.value_and_grad": lambda: jax.value_and_grad,
           "jax.vjp": lambda: jax.vjp, "jax.shard_map": lambda: jax.shard_map,
           "jax.lax.psum": lambda: jax.lax.psum, "jax.lax.pmean": lambda: jax.lax.pmean,
           "jax.lax.all_gather": lambda: jax.lax.all_gather}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _body(seen):
    before = {k: get() for k, get in WATCHED.items()}

    def body(w, x):
        seen.append({k for k, get in WATCHED.items() if get() is not before[k]})

        def loss(w):
            return jnp.mean(jnp.tanh(x @ w) ** 2)

        g = jax.grad(loss)(jax.lax.pcast(w, "dp", to="varying"))
        return jax.lax.pmean(g, "dp")

    return body


@pytest.mark.parametrize("face", ["st.shard_map", "typed_shard_map", "checking", "infer"])
def test_no_jax_function_is_replaced_while_a_face_traces(mesh, face):
    seen: list[set[str]] = []
    body = _body(seen)
    specs = dict(mesh=mesh, in_specs=(P(None, "tp"), P("dp")), out_specs=P(None, "tp"))
    w = jax.device_put(jnp.ones((8, 8)) / 8, NamedSharding(mesh, P(None, "tp")))
    x = jax.device_put(jnp.arange(32.0).reshape(4, 8) / 32, NamedSharding(mesh, P("dp")))
    if face == "st.shard_map":
        out = jax.jit(st.shard_map(body, **specs))(w, x)
    elif face == "typed_shard_map":
        out = jax.jit(st.adapters.typed_shard_map(body, **specs))(w, x)
    elif face == "checking":
        out = st.adapters.checking(jax.jit(jax.shard_map(body, **specs)))(w, x)
    else:
        rep = st.adapters.infer(body, w, x, **specs)
        assert rep.ok, [str(v) for v in rep.violations]
        out = None
    assert seen and all(s == set() for s in seen), seen
    if out is not None:
        want = jax.jit(jax.shard_map(body, **specs))(w, x)
        np.testing.assert_allclose(np.asarray(out), np.asarray(want), rtol=1e-6)


def test_a_gradient_library_bound_before_is_checked(mesh):
    """A grad function bound at import time (here: captured before spmdtyped is used) still
    has its gradients read from the jaxpr: the expert-gradient psum over its own shard axis
    is SPMD108 at the line."""
    grad = jax.grad   # bound "at import", as a library does

    def body(w, x):
        g = grad(lambda w: 0.5 * jnp.sum((x[0] @ w[0]) ** 2))(jax.lax.pcast(w, "dp", to="varying"))
        return jax.lax.psum(g, ("dp", "tp"))  # BUG: sums different experts' gradients

    w = jnp.ones((4, 3, 2))
    x = jnp.ones((2, 5, 3))
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(st.adapters.typed_shard_map(body, mesh=mesh, in_specs=(P("tp"), P("dp")),
                                            out_specs=P("tp")))(w, x)
    assert ei.value.code == "SPMD108"
    assert ei.value.line == body.__code__.co_firstlineno + 2


def _jax_attribute_writes(tree: ast.AST) -> list[str]:
    """`setattr(jax..., ...)` / `jax.x = ...` / `module.attr = ...` of a JAX module in a file."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
            out.append(ast.unparse(node))
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and ast.unparse(t).split(".")[0] in (
                        "jax", "api", "lax", "ad", "batching", "mlir", "pe"):
                    out.append(ast.unparse(node))
    return out


def test_the_package_writes_one_jax_attribute():
    """Only `_compat.hook_grad_vjp` writes a JAX module attribute (`api.vjp`); no other module
    of the package replaces anything in JAX."""
    found = {}
    for path in sorted(PKG.rglob("*.py")):
        writes = [w for w in _jax_attribute_writes(ast.parse(path.read_text()))
                  if "object.__setattr__" not in w and not w.startswith("setattr(SArray")
                  and not w.startswith("setattr(_AtIndex")]
        if writes:
            found[str(path.relative_to(PKG))] = writes
    assert found == {"_compat.py": ["api.vjp = hooked"]}, found


def _dp_mesh():
    return jax.make_mesh((8,), ("dp",), axis_types=(jax.sharding.AxisType.Auto,))


def test_per_example_gradients_read_from_the_jaxpr():
    """`jax.vmap(jax.grad(f))` w.r.t. a replicated parameter of a per-device loss: SPMD407 at
    the `jax.vmap` line (JAX sums each per-example gradient over the devices); summed over the
    batch right away it is the total gradient, accepted and equal to one device's; `jax.jacrev`
    (a vmap of the pullback only) is not per example."""
    mesh = _dp_mesh()
    w, xs = jnp.linspace(0.1, 0.8, 3), jnp.linspace(-1, 1, 48).reshape(16, 3)

    def net(p, x):
        return jnp.sin(jnp.dot(p, x))

    def per_example(p, x):
        return jax.vmap(jax.grad(net), in_axes=(None, 0))(p, x)  # per-example (BUG)

    def total(p, x):   # summed over the batch right away: JAX's sum over devices is right
        return jax.vmap(jax.grad(net), in_axes=(None, 0))(p, x).sum(0)

    def jac(p, x):
        return jax.jacrev(lambda p: jnp.sin(x @ p))(p)

    specs = dict(mesh=mesh, in_specs=(P(), P("dp")))
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(st.adapters.typed_shard_map(per_example, out_specs=P("dp"), **specs))(w, xs)
    assert ei.value.code == "SPMD407"
    assert ei.value.line == per_example.__code__.co_firstlineno + 1
    got = jax.jit(st.adapters.typed_shard_map(total, out_specs=P(), **specs))(w, xs)
    ref = jax.grad(lambda p: jnp.sum(jax.vmap(net, in_axes=(None, 0))(p, xs)))(w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref), rtol=1e-5)
    # not read as per example (the forward pass is not under the vmap): JAX's own numbers
    # (which sum the rows of the devices' Jacobians: docs/refinement.md, out of reach)
    jacobian = jax.jit(st.adapters.typed_shard_map(jac, out_specs=P("dp"), **specs))(w, xs)
    raw = jax.jit(jax.shard_map(jac, out_specs=P("dp"), **specs))(w, xs)
    np.testing.assert_array_equal(np.asarray(jacobian), np.asarray(raw))
