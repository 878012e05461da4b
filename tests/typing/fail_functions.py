# legs: plugin
"""Errors from the function tables (numpy aliases, constructors, `st.nn`), gradients typed from
a direct call's arguments, and a shard_map output that does not fit its out_spec."""

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.numpy as snp
from spmdtyped import Invariant, Reduced, Unreduced, Varying


def tables(u: Unreduced["tp"], r: Reduced["tp"], x: Varying["dp"]) -> None:
    snp.less(u, 0.0)  # E: spmd-nonlinear-unreduced
    snp.power(u, 2)  # E: spmd-nonlinear-unreduced
    snp.subtract(u, x)  # E: spmd-unreduced-mismatch
    snp.full((4,), u)  # E: spmd-unreduced-mismatch
    st.nn.relu(u)  # E: spmd-nonlinear-unreduced
    st.nn.softmax(r, axis=-1)  # E: spmd-reduced-replicated
    st.nn.one_hot(r, 8)  # E: spmd-reduced-replicated


def dtype_spellings(u: Unreduced["tp"], x: Varying["tp"]) -> None:
    """Every spelling of an integer or bool dtype (issue 26): rounding a partial sum."""
    u.astype(jnp.int32)  # E: spmd-nonlinear-unreduced
    u.astype(np.int32)  # E: spmd-nonlinear-unreduced
    u.astype("int32")  # E: spmd-nonlinear-unreduced
    u.astype(int)  # E: spmd-nonlinear-unreduced
    u.astype(bool)  # E: spmd-nonlinear-unreduced
    u.astype(jnp.bool_)  # E: spmd-nonlinear-unreduced
    snp.sum(u, dtype=jnp.int32)  # E: spmd-nonlinear-unreduced
    snp.sum(u, dtype="int32")  # E: spmd-nonlinear-unreduced
    snp.sum(u, dtype=bool)  # E: spmd-nonlinear-unreduced
    u.astype(jnp.float16)  # a float: linear
    snp.sum(u, dtype=np.float32)
    x.astype(jnp.int32)  # Varying: every device rounds its own value


def loss_fn(w: Varying["dp"], x: Varying["dp"]) -> Varying["dp"]:
    return x


def invariant_gradient(i: Invariant, x: Varying["dp"]) -> None:
    g = st.grad(loss_fn)(i, x)          # Invariant parameter: already summed over dp
    st.pmean(g, "dp")  # E: spmd-invariant-operand


def layer(x: Varying["dp"], w: Varying["tp"]) -> Varying["dp", "tp"]:
    return x @ w


def boundary(mesh: Any, x: Any, w: Any) -> None:
    f = st.shard_map(layer, mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=P("dp"))
    f(x, w)  # E: spmd-out-spec-state


@st.shard_map(mesh=None, in_specs=P("dp"), out_specs=P())
def local_loss(x: Varying["dp"]) -> Varying["dp"]:     # forgot st.pmean(..., "dp")
    return x


def decorated(x: Any) -> None:
    local_loss(x)  # E: spmd-out-spec-state
