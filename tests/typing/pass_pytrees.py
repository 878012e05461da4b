# legs: plugin
"""Pytrees with the plugin: equinox / flax nnx modules, dataclasses and NamedTuples whose fields
are hinted with states construct from global arrays and from `PartitionSpec`s (the module as
its spec tree) with no `type: ignore`; `self.w` in a method has its field's state;
`jax.tree.map` lambdas take the leaf types of the trees' static types; the gradient of a
module parameter is the module."""

import dataclasses
from typing import Any, NamedTuple, assert_type

import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying


class MLP(eqx.Module):
    """Megatron: column-parallel in, row-parallel out, the bias after the psum."""

    w1: st.Shard["tp", -1]  # P(None, "tp")
    w2: st.Shard["tp", -2]  # P("tp", None)
    b: Invariant

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        h = st.numpy.tanh(x @ self.w1)
        assert_type(self.b, Invariant)
        return st.psum(h @ self.w2, "tp") + self.b


class Dense(nnx.Module):
    """flax nnx: the hints on `__init__`'s parameters, the fields assigned from them."""

    def __init__(self, w: Varying["tp"], b: Invariant) -> None:
        self.w = w
        self.b = nnx.Param(b)

    def __call__(self, x: Varying["dp"]) -> Varying["dp", "tp"]:
        assert_type(self.w, Varying["tp"])
        assert_type(self.b.value, Invariant)
        return x @ self.w + self.b.value


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Adam:
    mu: Varying["tp"]
    count: Invariant


class Params(NamedTuple):
    w: Varying["tp"]
    b: Invariant


def build(key: jax.Array) -> tuple[MLP, MLP, Dense, Adam, Params]:
    w1, w2 = jax.random.normal(key, (4, 16)), jnp.ones((16, 4))
    model = MLP(w1, w2, jnp.zeros(4))                      # global arrays
    specs = MLP(P(None, "tp"), P("tp", None), P())         # its spec tree
    dense = Dense(w1, jnp.zeros(16))
    return model, specs, dense, Adam(w1, jnp.zeros(())), Params(w1, 0.0)


def inside(model: MLP, dense: Dense, x: Varying["dp"], w: Varying["tp"]) -> MLP:
    again = MLP(model.w1, model.w2, model.b)               # typed values of the fields' states
    assert_type(Dense(w, model.b).w, Varying["tp"])
    assert_type(dense(x), Varying["dp", "tp"])
    return again


def loss_fn(m: MLP, x: Varying["dp"]) -> Invariant:
    return st.pmean((m(x) ** 2).mean(), "dp")


def step(model: MLP, x: Varying["dp"]) -> MLP:
    grads = st.grad(loss_fn)(model, x)
    assert_type(grads, MLP)                                # Shard and Invariant fields: their own cotangents
    scaled = jax.tree.map(lambda g: 0.5 * g, grads)
    assert_type(scaled, MLP)
    return jax.tree.map(lambda p, g: p - 0.1 * g, model, scaled)


def step_jax(model: MLP, x: Varying["dp"]) -> tuple[Invariant, MLP]:
    loss, grads = jax.value_and_grad(loss_fn)(model, x)    # a typed loss: st.value_and_grad's
    assert_type(loss, Invariant)
    assert_type(grads, MLP)
    return loss, grads


def trees(p: Params, d: dict[str, Varying["tp"]], t: tuple[Varying["dp"], Invariant],
          opt: Adam) -> None:
    assert_type(jax.tree.map(lambda a: st.psum(a, "tp"), d), dict[str, Invariant])
    # the lambda is checked once, on the union of the leaves: each leaf is its result
    assert_type(jax.tree.map(lambda a: a * 2, t), tuple[Varying["dp"], Varying["dp"]])
    doubled = jax.tree.map(lambda a: a * 2, p)
    assert_type(doubled[0], Varying["tp"])
    assert_type(jax.tree.map(lambda m: 0.9 * m, opt), Adam)
    assert_type(jax.tree_util.tree_map(lambda a, b: a + b, d, d), dict[str, Varying["tp"]])
    assert_type(jax.tree.map_with_path(lambda path, a: a * 2, d), dict[str, Varying["tp"]])


def untouched(model: MLP, raw: dict[str, jax.Array], anything: Any) -> None:
    # no typed leaf, an `is_leaf`, a `def`: JAX's own signature (Any)
    assert_type(jax.tree.map(lambda a: a, raw), Any)
    assert_type(jax.tree.map(lambda a: a, model, is_leaf=lambda v: v is None), Any)
    assert_type(jax.tree.map(lambda a: a, anything), Any)

    def double(a: Any) -> Any:
        return 2 * a

    assert_type(jax.tree.map(double, model), Any)
