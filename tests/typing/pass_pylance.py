# legs: plugin mypy pyright stub
# ruff: noqa: F722  (jaxtyping dims strings)
"""The forms the editor tier must take without a false error (issue 23), under every checker:
the decorator form of `st.shard_map` (bare and with specs), jaxtyping-style hints (the dims
string is metadata, not a type), `Shard` dims of both signs (`Literal` ints: a bare `-1` is not
a type for plain mypy and pyright), the axis vocabulary imported once (`axes.py`, as
`stubgen --vocab axes.py` writes it), and `Any` values where the stub cannot pick an overload."""

from typing import Any, Literal

import jax
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Shard, Varying

mesh = jax.make_mesh((2, 4), ("dp", "tp"))


@st.shard_map(mesh=mesh)
def bare_decorator(x: Varying["dp"]) -> Varying["dp"]:
    return x * 2.0


@st.shard_map(mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=P("dp", "tp"))
def with_specs(x: st.Float[Varying["dp"], "b d"], w1: st.Float[Varying["tp"], "d f/tp"]
               ) -> st.Float[Varying["dp | tp"], "b f/tp"]:
    return st.nn.gelu(x @ w1)


@jax.jit
@st.shard_map(mesh=mesh, in_specs=P("dp"), out_specs=P(), check_vma=True)
def stacked(x: Varying["dp"]) -> Invariant:
    return st.pmean(st.numpy.mean(x), "dp")


def shard_dims(left: Shard["tp", Literal[0]], right: Shard["tp", Literal[-1]],
               ranked: st.Float[Shard["tp", Literal[0]], "f d"]) -> Varying["tp"]:
    plain: Varying["tp"] = left            # a Shard is a Varying value for every checker
    plain = right
    return st.numpy.tanh(ranked) + plain


def annotated_lambda(losses: list[Varying["dp"]]) -> list[Invariant]:
    # the leaf annotated: an `Any` leaf is fail_pylance.py's known limit of the stub
    def mean(loss: Varying["dp"]) -> Invariant:
        return st.pmean(loss, "dp")
    return jax.tree.map(mean, losses)


def raw_values(g: jax.Array, w: Reduced["dp"]) -> Any:
    return st.psum(g, "tp"), w * 2.0
