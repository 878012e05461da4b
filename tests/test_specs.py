"""`st.shard_map` without in_specs/out_specs derives them from hints that name dimensions."""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import put
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying
from spmdtyped._boundary.specs import derive

eqx = pytest.importorskip("equinox")
optax = pytest.importorskip("optax")


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

    # a hint without dimensions, and an argument that is not a global array on the mesh
    one_device = jax.device_put(jnp.ones((8, 4)), jax.devices()[1])
    with pytest.raises(st.SpmdTypeError, match="names no dimension partitioned over it") as ei:
        f(one_device)
    assert ei.value.code == "SPMD402" and "batch/dp d" in str(ei.value)
    assert "not a global array on the mesh" in str(ei.value)
    # the same argument sharded on the mesh: its spec is read from it (JAX's Infer)
    assert float(f(put(mesh_dp_tp, jnp.ones((8, 4)), P("dp")))) == 32.0

    @st.shard_map(mesh=mesh_dp_tp, in_specs=(P(),))
    def g(m: Bare) -> jax.Array:
        return m.w

    with pytest.raises(st.SpmdTypeError, match=r"return hint .*Array names no state"):
        g(Bare(jnp.ones(2)))

    @st.shard_map(mesh=mesh_dp_tp)
    def h(a: Any, b: Any) -> Any:
        return a

    with pytest.raises(st.SpmdTypeError, match=r"parameters 'a', 'b', whose specs differ") as ei:
        h(put(mesh_dp_tp, jnp.ones(8), P("dp")), put(mesh_dp_tp, jnp.ones(8), P()))
    assert ei.value.code == "SPMD402"


def test_traced_argument_on_an_auto_mesh_is_a_clear_error():
    auto = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)

    @jax.jit
    @st.shard_map(mesh=auto)
    def f(x: Any) -> Any:
        return x

    x = jax.device_put(jnp.ones((8, 4)), NamedSharding(auto, P("dp")))
    with pytest.raises(st.SpmdTypeError, match=r"x: the hint .*Any.*Auto axes") as ei:
        f(x)
    assert ei.value.code == "SPMD402"


class Bare(eqx.Module):
    w: jax.Array


def train_step(model: MLP, emb: jax.Array, opt_state: optax.OptState,
               batch: Batch) -> tuple[MLP, optax.OptState, Invariant]:
    def loss_fn(m: MLP) -> Invariant:
        h = jax.nn.relu(batch.x @ m.w1)
        y = st.psum(h @ m.w2, "tp") + m.b
        return st.pmean(jnp.mean((y - batch.y) ** 2), "dp")

    loss, g = st.value_and_grad(loss_fn)(model)
    updates, opt_state = OPT.update(g, opt_state, model)
    return optax.apply_updates(model, updates), opt_state, loss


OPT = optax.adam(0.05)
SPECS = MLP(P(None, "tp"), P("tp"), P())


def test_derived_specs_of_dim_hints_mixed_with_an_untyped_optimiser_state():
    # dims named by the hints (model, batch); an `optax.OptState` (Any to a type checker) and
    # a `jax.Array` hint read from the arguments' shardings, fsdp included
    mesh = jax.make_mesh((2, 2, 2), ("dp", "fsdp", "tp"))
    model = jax.tree.map(lambda a, s: put(mesh, a, s), _mlp(), SPECS)
    state = OPT.init(model)  # mu / nu carry the params' shardings
    emb = put(mesh, jnp.ones((8, 4)), P("fsdp", "tp"))
    batch = Batch(put(mesh, jnp.ones((8, 4)), P("dp")), put(mesh, jnp.ones((8, 4)), P("dp")))
    in_specs, out_specs = derive(train_step, (model, emb, state, batch), None, None, "t", mesh)
    state_specs = (optax.ScaleByAdamState(P(), SPECS, SPECS), optax.EmptyState())
    assert in_specs == (SPECS, P("fsdp", "tp"), state_specs, Batch(P("dp"), P("dp")))
    assert out_specs == (SPECS, state_specs, P())


def test_training_step_with_an_optimiser_state_runs_and_matches_reference(mesh_dp_tp):
    x = jnp.linspace(-1, 1, 32).reshape(8, 4)
    model0 = _mlp()
    model = jax.tree.map(lambda a, s: put(mesh_dp_tp, a, s), model0, SPECS)
    state = OPT.init(model)
    step = jax.jit(st.shard_map(train_step, mesh=mesh_dp_tp))
    batch = Batch(put(mesh_dp_tp, x, P("dp")), put(mesh_dp_tp, jnp.sin(x), P("dp")))
    emb = put(mesh_dp_tp, jnp.ones((8, 4)), P("dp", "tp"))
    ref, ref_state = model0, OPT.init(model0)

    def ref_loss(m):
        return jnp.mean((jax.nn.relu(x @ m.w1) @ m.w2 + m.b - jnp.sin(x)) ** 2)

    for _ in range(3):
        model, state, loss = step(model, emb, state, batch)
        ref_l, g = jax.value_and_grad(ref_loss)(ref)
        upd, ref_state = OPT.update(g, ref_state, ref)
        ref = optax.apply_updates(ref, upd)
        np.testing.assert_allclose(float(loss), float(ref_l), rtol=1e-5)
    assert model.w1.sharding.spec == P(None, "tp")
    assert state[0].mu.w1.sharding.spec == P(None, "tp")
    for a, b in zip(jax.tree.leaves((model, state)), jax.tree.leaves((ref, ref_state)), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_specs_read_from_the_arguments_follow_their_placement(mesh_dp_tp):
    @st.shard_map(mesh=mesh_dp_tp)
    def double(x: Any) -> Any:
        return 2 * x

    for spec in (P("dp"), P(None, "tp"), P()):
        out = double(put(mesh_dp_tp, jnp.arange(32.0).reshape(8, 4), spec))
        assert out.sharding.is_equivalent_to(NamedSharding(mesh_dp_tp, spec), 2)
        np.testing.assert_array_equal(np.asarray(out), 2 * np.arange(32.0).reshape(8, 4))
