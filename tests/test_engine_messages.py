"""Messages that locate the bug (issue 27): a boundary error names the output and its pytree
path; an output that lacks its reduction is reported at the projection whose psum is missing
(the cause), not as "psum the loss"."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import spmdtyped as st

mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)


def test_boundary_error_names_the_output_path():
    def body(x):
        return {"loss": jnp.ones(()), "blocks": [{"b": jnp.ones(2)}, {"b": x[0]}]}

    specs = {"loss": P(), "blocks": [{"b": P()}, {"b": P()}]}
    f = st.shard_map(body, mesh=mesh, in_specs=P("dp"), out_specs=specs)
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(f)(jnp.ones((8, 2)))
    e = ei.value
    assert e.code == "SPMD401"
    assert "out['blocks'][1]['b']" in str(e), str(e)


def test_missing_psum_reported_at_the_projection():
    def body(x, w1, w2, b):
        h = jax.nn.relu(x @ w1)
        return h @ w2 + b            # the psum over tp forgotten

    f = st.shard_map(body, mesh=mesh, in_specs=(P("dp"), P(None, "tp"), P("tp"), P()),
                     out_specs=P("dp"))
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.jit(f)(jnp.ones((8, 4)), jnp.ones((4, 8)), jnp.ones((8, 4)), jnp.ones(4))
    e = ei.value
    assert (e.code, e.line) == ("SPMD210", body.__code__.co_firstlineno + 2), str(e)
    assert "st.psum(x, 'tp') + b" in e.fix
    assert e.__cause__ is not None and e.__cause__.code == "SPMD401"


def _clipped_step(clip, face):
    """A tensor-parallel step that clips its gradients with `clip` (an optax transformation)
    before an SGD update: the gradients of w1 / w2 are sharded over tp."""
    import optax

    opt = optax.chain(clip, optax.sgd(0.1))

    def step(p, s, x, y):
        def loss(p):
            h = jax.lax.psum(jax.nn.relu(x @ p["w1"]) @ p["w2"], "tp")
            return jax.lax.pmean(jnp.mean((h - y) ** 2), "dp")
        value, g = jax.value_and_grad(loss)(p)
        updates, s = opt.update(g, s, p)  # the clipping call's line
        return optax.apply_updates(p, updates), s, value

    specs = {"w1": P(None, "tp"), "w2": P("tp", None)}
    k = jax.random.split(jax.random.key(60), 4)
    params = {"w1": jax.random.normal(k[0], (4, 8)), "w2": jax.random.normal(k[1], (8, 4))}
    x, y = jax.random.normal(k[2], (8, 4)), jax.random.normal(k[3], (8, 4))
    state = opt.init(params)
    sspecs = jax.tree.map(lambda _: P(), state)
    smap = st.adapters.typed_shard_map if face == "typed_shard_map" else jax.shard_map
    program = jax.jit(smap(step, mesh=mesh, in_specs=(specs, sspecs, P("dp"), P("dp")),
                           out_specs=(specs, sspecs, P())))
    program = st.adapters.checking(program) if face == "checking" else program

    def reference():
        value, g = jax.value_and_grad(
            lambda p: jnp.mean((jax.nn.relu(x @ p["w1"]) @ p["w2"] - y) ** 2))(params)
        return optax.apply_updates(params, opt.update(g, state, params)[0])

    return program, (params, state, x, y), reference


@pytest.mark.parametrize("face", ["typed_shard_map", "checking"])
def test_a_bug_inside_an_installed_package_is_named_at_the_users_call(face):
    """`optax.clip_by_global_norm` of tensor-parallel gradients: each device clips by the norm
    of its own shards (the sqrt of a partial sum, SPMD211). The violation is in optax's code;
    it is named at the user's line that calls into optax (with the function's name), optax's
    line kept beside it, and `st.clip_by_global_norm` (the fix) gives one device's update."""
    optax = pytest.importorskip("optax")
    program, args, reference = _clipped_step(optax.clip_by_global_norm(0.1), face)
    with pytest.raises(st.SpmdTypeError) as ei:
        program(*args)
    e = ei.value
    line = next(n for n, text in enumerate(open(__file__), 1)
                if text.rstrip().endswith("# the clipping call's line"))
    assert e.code == "SPMD211" and (e.file, e.line) == (__file__, line), str(e)
    assert "step)" in str(e) and "optax" in str(e) and "st.clip_by_global_norm" in str(e)

    fixed, args, reference = _clipped_step(st.clip_by_global_norm(0.1), face)
    got, _state, _loss = fixed(*args)
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(reference()), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
    raw, args, _ = _clipped_step(optax.clip_by_global_norm(0.1), "jax")
    got, _state, _loss = raw(*args)   # JAX runs the bug: each device's own norm
    assert not all(np.allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)
                   for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(reference()), strict=True))


def test_a_bias_inside_an_equinox_linear_layer_is_named_at_the_layers_call():
    """A row-parallel projection built from `eqx.nn.Linear(use_bias=True)` and then psum'd over
    tp: the layer adds its (replicated) bias to the partial sums inside equinox's code
    (SPMD210). The error names the model's line that calls the layer; raw JAX computes a wrong
    loss (against one device)."""
    eqx = pytest.importorskip("equinox")

    class Block(eqx.Module):
        up: eqx.nn.Linear
        down: eqx.nn.Linear

        def __call__(self, x, psum=lambda v: jax.lax.psum(v, "tp")):
            h = jax.nn.relu(jax.vmap(self.up)(x))
            return psum(jax.vmap(self.down)(h))  # the down projection's call

    k = jax.random.split(jax.random.key(61), 3)
    model = Block(eqx.nn.Linear(4, 8, use_bias=False, key=k[0]),
                  eqx.nn.Linear(8, 4, use_bias=True, key=k[1]))
    specs = eqx.tree_at(lambda b: (b.up.weight, b.down.weight, b.down.bias),
                        jax.tree.map(lambda _: P(), model), (P("tp", None), P(None, "tp"), P()))
    x = jax.random.normal(k[2], (8, 4))
    placed = (jax.tree.map(lambda a, s: jax.device_put(a, jax.sharding.NamedSharding(mesh, s)),
                           model, specs),
              jax.device_put(x, jax.sharding.NamedSharding(mesh, P("dp"))))

    def body(m, x):
        return jax.lax.pmean(jnp.mean(m(x) ** 2), "dp")

    def program(smap):
        return jax.jit(smap(body, mesh=mesh, in_specs=(specs, P("dp")), out_specs=P()))

    with pytest.raises(st.SpmdTypeError) as ei:
        program(st.adapters.typed_shard_map)(*placed)
    e = ei.value
    line = next(n for n, text in enumerate(open(__file__), 1)
                if text.rstrip().endswith("# the down projection's call"))
    assert e.code == "SPMD210" and (e.file, e.line) == (__file__, line), str(e)
    assert "Block.__call__" in str(e) and "equinox" in str(e), str(e)
    wrong = float(program(jax.shard_map)(*placed))
    right = float(jnp.mean(model(x, psum=lambda v: v) ** 2))
    assert not np.isclose(wrong, right, rtol=1e-3)
