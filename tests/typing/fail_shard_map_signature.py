# legs: plugin
# ruff: noqa: F841  (assignments checked for their static errors)
"""Calls of a function under `st.shard_map` with the wrong arguments are mypy's own errors
at the call site: the boundary passes arguments by position only (`jax.shard_map` takes no
keyword arguments), so keywords are errors too."""

from typing import Any

import jax
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Varying

OUT = P("dp")


def layer(x: Varying["dp"], w: Varying["tp"], *, scale: float = 1.0) -> Varying["dp"]:
    return st.psum(x @ w, "tp") * scale


@st.shard_map(mesh=None, in_specs=P("dp"), out_specs=P())
def loss(x: Varying["dp"]) -> Invariant:
    return st.pmean(x.sum(), "dp")


@st.shard_map(mesh=None, in_specs=P("dp"), out_specs=OUT)   # out_specs not literal
def loose(x: Varying["dp"], y: Varying["dp"]) -> Varying["dp"]:
    return x + y


def callers(mesh: Any, x: jax.Array, w: jax.Array) -> None:
    f = st.shard_map(layer, mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=P("dp"))
    f(x)  # E: call-arg
    f(x, w, w)  # E: call-arg
    f(x, w, scale=2.0)  # E: call-arg
    f(x=x, w=w)  # E: call-arg, call-arg
    f("x", w)  # E: arg-type
    loss(x, x)  # E: call-arg
    loss()  # E: call-arg
    loose(x)  # E: call-arg
    y: int = loss(x)  # E: assignment
