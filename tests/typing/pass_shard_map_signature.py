# legs: plugin
"""Callers of a function under `st.shard_map` see its positional parameters: typed-state
parameters take `jax.typing.ArrayLike` (global arrays, NumPy arrays, scalars), other parameters
keep their types (an `eqx.Module`-like class), and typed outputs are `jax.Array`s."""

from dataclasses import dataclass
from typing import Any, assert_type

import jax
import numpy as np
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying

OUT = P("dp")


@dataclass
class Model:
    w: Varying["tp"]
    b: Invariant


def layer(x: Varying["dp"], w: Varying["tp"]) -> tuple[Varying["dp"], Invariant]:
    y = st.psum(x @ w, "tp")
    return y, st.psum(y.sum(), "dp")


@st.shard_map(mesh=None, in_specs=P("dp"), out_specs=(P(), P("dp")))
def decorated(x: Varying["dp"]) -> tuple[Invariant, Varying["dp"]]:
    return st.pmean(x.sum(), "dp"), x


@st.shard_map(mesh=None, in_specs=(None, P("dp")), out_specs=OUT)   # out_specs not literal
def apply(model: Model, x: Varying["dp"], scale: float = 1.0) -> Varying["dp"]:
    return st.psum(x @ model.w, "tp") * scale


@st.shard_map(mesh=None, in_specs=P("dp"), out_specs=P("dp"), axis_names={"dp"})
def total(*xs: Varying["dp"]) -> list[Varying["dp"]]:
    return list(xs)


@st.shard_map(mesh=None, in_specs=P("dp"), out_specs=None)      # out_specs derived from the hints
def derived(x: st.Float[Varying["dp"], "b/dp d"]) -> st.Float[Varying["dp"], "b/dp d"]:
    return x * 2


def callers(mesh: Any, x: jax.Array, w: jax.Array, model: Model) -> None:
    f = st.shard_map(layer, mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=(P("dp"), P()))
    assert_type(f(x, w), tuple[jax.Array, jax.Array])
    f(np.ones((8, 4)), 1.0)           # NumPy arrays and scalars are accepted at the boundary
    assert_type(decorated(x), tuple[jax.Array, jax.Array])
    assert_type(apply(model, x), jax.Array)      # the module parameter keeps its class
    apply(model, x, 2.0)
    assert_type(total(x, x, x), list[jax.Array])
    total()
    assert_type(derived(x), jax.Array)
