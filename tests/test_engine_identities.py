"""Primitives that return their operand as it is (`_rules.primitives.IDENTITIES`) keep what the
engine knows of it. Production code puts them between a column-parallel activation and the
row-parallel projection: `jax.lax.with_sharding_constraint` or `jax.sharding.reshard` over the
mesh's auto axes inside a shard_map over tp only (`axis_names={"tp"}`, the dp axis left to the
compiler, under `jax.set_mesh`), and `checkpoint_name` (the tag of a remat policy). Before they
were identities, each dropped the activation's Shard, and the bias added before the psum ran
silently wrong under every face. For each: the correct step equals one device in loss and
gradients, the buggy one is SPMD210 at its line under `typed_shard_map`, `checking()` and
`st.shard_map`, and raw JAX's loss is wrong against one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import line_ending_with
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

#: the identity between the activation and the projection -> (its call, the mesh's axis type)
KINDS = {
    "with_sharding_constraint": (lambda h: jax.lax.with_sharding_constraint(h, P("dp", None)),
                                 AxisType.Auto),
    "reshard": (lambda h: jax.sharding.reshard(h, P("dp", None)), AxisType.Explicit),
    "checkpoint_name": (lambda h: checkpoint_name(h, "hidden"), AxisType.Explicit),
}
SPECS = (P(None, "tp"), P("tp", None), P(), P())
FACES = ["typed_shard_map", "checking", "st.shard_map"]


def _inputs():
    k = jax.random.split(jax.random.key(3), 3)
    return (jax.random.normal(k[0], (8, 16)) / 3, jax.random.normal(k[1], (16, 8)) / 4,
            jnp.linspace(-1.0, 1.0, 8), jax.random.normal(k[2], (6, 8)))


def _reference(w1, w2, b, x):
    return jax.value_and_grad(lambda w1, w2, b: jnp.mean((jax.nn.relu(x @ w1) @ w2 + b) ** 2),
                              argnums=(0, 1, 2))(w1, w2, b)


def _run(kind, face, bug):
    place, axis_type = KINDS[kind]
    mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(axis_type,) * 2)

    def mlp(w1, w2, b, x):
        h = place(jax.nn.relu(x @ w1))
        if bug:
            return jax.lax.psum(h @ w2 + b, "tp")  # the bias's line
        return jax.lax.psum(h @ w2, "tp") + b

    smap = {"typed_shard_map": st.adapters.typed_shard_map, "st.shard_map": st.shard_map}.get(
        face, jax.shard_map)
    inner = smap(mlp, in_specs=SPECS, out_specs=P(), axis_names={"tp"})
    step = jax.jit(jax.value_and_grad(lambda w1, w2, b, x: jnp.mean(inner(w1, w2, b, x) ** 2),
                                      argnums=(0, 1, 2)))
    if face == "checking":
        step = st.adapters.checking(step)
    w1, w2, b, x = _inputs()
    with jax.set_mesh(mesh):
        put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
        return step(put(w1, SPECS[0]), put(w2, SPECS[1]), put(b, P()), put(x, P("dp", None)))


def _line(marker):
    return line_ending_with(__file__, marker)


@pytest.mark.parametrize("face", [*FACES, "jax"])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_correct_step_equals_one_device(kind, face):
    loss, grads = _run(kind, face, bug=False)
    ref_loss, ref_grads = _reference(*_inputs())
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_bias_before_the_psum_behind_an_identity(kind, face):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(kind, face, bug=True)
    assert e.value.code == "SPMD210", str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line("# the bias's line"))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_bug_is_real(kind):
    loss, _ = _run(kind, "jax", bug=True)
    ref_loss, _ = _reference(*_inputs())
    assert not np.isclose(float(loss), float(ref_loss), rtol=1e-3)
