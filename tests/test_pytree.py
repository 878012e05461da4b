"""Pytrees all the way: wrap/unwrap and st.shard_map's boundary descend into eqx.Module, flax
nnx state, registered dataclasses and NamedTuples; outputs leave as plain jax.Arrays."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import put
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped._typed.array import is_typed

eqx = pytest.importorskip("equinox")
nnx = pytest.importorskip("flax.nnx")


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Params:
    w: jax.Array
    b: jax.Array


class Pair(NamedTuple):
    a: jax.Array
    b: jax.Array


class Lin(eqx.Module):
    w: jax.Array
    b: jax.Array


def _containers():
    w, b = jnp.ones((4, 8)), jnp.zeros(8)
    graphdef, state = nnx.split(nnx.Linear(4, 8, rngs=nnx.Rngs(0)))
    return {"dataclass": Params(w, b), "namedtuple": Pair(w, b), "eqx": Lin(w, b), "nnx": state}


@pytest.mark.parametrize("kind", ["dataclass", "namedtuple", "eqx", "nnx"])
def test_wrap_and_unwrap_descend(kind):
    tree = _containers()[kind]
    typed = st.wrap(tree)
    assert type(typed) is type(tree)
    leaves = jax.tree.leaves(typed, is_leaf=is_typed)
    assert leaves and all(type(x) is st.Invariant for x in leaves)
    back = st.unwrap(typed)
    assert type(back) is type(tree)
    raw = jax.tree.leaves(back, is_leaf=is_typed)
    assert raw and all(isinstance(x, jax.Array) and not is_typed(x) for x in raw)


@pytest.mark.parametrize("kind", ["dataclass", "namedtuple", "eqx", "nnx"])
def test_shard_map_typed_inside_plain_outside(mesh_dp_tp, kind):
    tree = _containers()[kind]
    seen = []

    def f(t):
        leaves = jax.tree.leaves(t, is_leaf=is_typed)
        seen.extend(type(x) for x in leaves)
        return jax.tree.map(lambda x: x * 2.0, t)

    out = jax.jit(st.shard_map(f, mesh=mesh_dp_tp, in_specs=P(), out_specs=P()))(tree)
    assert seen and all(t is st.Invariant for t in seen)
    assert type(out) is type(tree)
    for o, i in zip(jax.tree.leaves(out), jax.tree.leaves(tree), strict=True):
        assert not is_typed(o) and isinstance(o, jax.Array)
        np.testing.assert_array_equal(np.asarray(o), 2.0 * np.asarray(i))


def test_registered_dataclass_output_is_plain(mesh_dp_tp):
    def f(x):
        return Params(x, st.psum(x.sum(), "dp"))  # the output itself is the dataclass

    out = st.shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=Params(P("dp"), P()))(
        put(mesh_dp_tp, jnp.arange(8.0), P("dp")))
    assert isinstance(out, Params)
    assert not is_typed(out.w) and not is_typed(out.b)
    assert float(out.b) == 28.0


def test_boundary_checks_reach_into_modules(mesh_dp_tp):
    def f(m):
        return Lin(m.w, m.b * st.axis_index("tp"))  # b becomes Varying over tp

    with pytest.raises(st.SpmdTypeError) as ei:
        st.shard_map(f, mesh=mesh_dp_tp, in_specs=P(), out_specs=P())(Lin(jnp.ones((4, 8)), jnp.ones(8)))
    assert ei.value.code == "SPMD401" and "'tp'" in str(ei.value)


def test_tree_map_returning_typed_values_never_nests(mesh_dp_tp):
    def f(m, lr):
        new = jax.tree.map(lambda p: p - lr * p, m)  # lr typed: each new leaf is typed
        assert all(not is_typed(x.raw) for x in jax.tree.leaves(new, is_leaf=is_typed))
        return new

    m = Lin(jnp.ones((4, 8)), jnp.ones(8))
    out = jax.jit(st.shard_map(f, mesh=mesh_dp_tp, in_specs=(P(), P()), out_specs=P()))(m, jnp.float32(0.5))
    assert not is_typed(out.w) and float(out.w[0, 0]) == 0.5
