"""`st.shard_map` without in_specs/out_specs derives them from hints that name dimensions."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import put
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying
from spmdtyped._specs import derive

eqx = pytest.importorskip("equinox")


class MLP(eqx.Module):
    w1: st.Float[Varying["tp"], "d ff/tp"]
    w2: st.Float[Varying["tp"], "ff/tp d"]
    b: st.Float[Invariant, "d"]


class Batch(NamedTuple):
    x: st.Float[Varying["dp"], "batch/dp d"]
    y: st.Float[Varying["dp"], "batch/dp d"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Scale:
    s: st.Float[Invariant, ""]


def _mlp():
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return MLP(jax.random.normal(k1, (4, 16)), jax.random.normal(k2, (16, 4)), jnp.ones(4))


def test_derived_specs_of_a_whole_parameter_pytree(mesh_dp_tp):
    model = _mlp()
    batch = Batch(jnp.ones((8, 4)), jnp.zeros((8, 4)))
    in_specs, out_specs = derive(step, (model, batch, Scale(jnp.float32(2.0))), None, None, "t")
    assert in_specs[0] == MLP(P(None, "tp"), P("tp"), P())
    assert in_specs[1] == Batch(P("dp"), P("dp"))
    assert out_specs == (MLP(P(None, "tp"), P("tp"), P()), P())


def step(model: MLP, batch: Batch, scale: Scale) -> tuple[MLP, Invariant]:
    def loss_fn(m: MLP) -> Invariant:
        h = jax.nn.relu(batch.x @ m.w1)
        y = st.psum(h @ m.w2, "tp") + m.b
        return st.pmean(jnp.mean((y - batch.y) ** 2), "dp")

    loss, g = st.value_and_grad(loss_fn)(model)
    new = jax.tree.map(lambda p, d: p - scale.s * d, model, g)
    return new, loss


def test_shard_map_without_specs_runs_and_matches_reference(mesh_dp_tp):
    model = _mlp()
    x = jnp.linspace(-1, 1, 32).reshape(8, 4)
    f = jax.jit(st.shard_map(step, mesh=mesh_dp_tp))
    specs = MLP(P(None, "tp"), P("tp"), P())
    sharded = jax.tree.map(lambda a, s: put(mesh_dp_tp, a, s), model, specs)
    new, loss = f(sharded, Batch(put(mesh_dp_tp, x, P("dp")), put(mesh_dp_tp, jnp.sin(x), P("dp"))),
                  Scale(jnp.float32(0.1)))
    assert isinstance(new, MLP) and isinstance(new.w1, jax.Array)

    def ref_loss(m):
        return jnp.mean((jax.nn.relu(x @ m.w1) @ m.w2 + m.b - jnp.sin(x)) ** 2)

    ref_l, ref_g = jax.value_and_grad(ref_loss)(model)
    np.testing.assert_allclose(float(loss), float(ref_l), rtol=1e-5)
    for a, p, g in zip(jax.tree.leaves(new), jax.tree.leaves(model), jax.tree.leaves(ref_g), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(p - 0.1 * g), rtol=1e-5, atol=1e-6)


def test_plain_hints_derive_too(mesh_dp_tp):
    @st.shard_map(mesh=mesh_dp_tp)
    def total(x: st.Float[Varying["dp"], "batch/dp d"]) -> Invariant:
        return st.psum(x.sum(), "dp")

    assert float(total(put(mesh_dp_tp, jnp.ones((8, 4)), P("dp")))) == 32.0


def test_underivable_hints_are_a_clear_error(mesh_dp_tp):
    @st.shard_map(mesh=mesh_dp_tp)
    def f(x: Varying["dp"]) -> Invariant:
        return st.psum(x.sum(), "dp")

    with pytest.raises(st.SpmdTypeError, match="names no dimension partitioned over it") as ei:
        f(put(mesh_dp_tp, jnp.ones((8, 4)), P("dp")))
    assert ei.value.code == "SPMD402" and "batch/dp d" in str(ei.value)

    @st.shard_map(mesh=mesh_dp_tp, in_specs=(P(),))
    def g(m: Bare) -> jax.Array:
        return m.w

    with pytest.raises(st.SpmdTypeError, match=r"return hint .*Array names no state"):
        g(Bare(jnp.ones(2)))

    @st.shard_map(mesh=mesh_dp_tp)
    def h(m: Bare) -> Bare:
        return m

    with pytest.raises(st.SpmdTypeError, match=r"m\.w: the hint .*Array names no state"):
        h(Bare(jnp.ones(2)))


class Bare(eqx.Module):
    w: jax.Array
