# legs: plugin
"""Precise results from the function tables (the `_surface.NUMPY` / `NN` rows): numpy
aliases and constructors, `st.nn`; gradients of a direct call typed from the arguments;
`st.shard_map` outputs that fit their out_specs."""

from typing import Any, assert_type

from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.numpy as snp
from spmdtyped import Invariant, Reduced, Typed, Unreduced, Varying


def aliases(x: Varying["dp"], w: Varying["tp"], u: Unreduced["tp"], r: Reduced["tp"]) -> None:
    assert_type(snp.subtract(x, w), Varying["dp", "tp"])
    assert_type(snp.add(u, u), Unreduced["tp"])                 # linear: Unreduced kept
    assert_type(snp.multiply(u, r), Unreduced["tp"])            # Unreduced x Reduced
    assert_type(snp.multiply(r, 2.0), Reduced["tp"])            # the literal is cast
    assert_type(snp.divide(u, 2.0), Unreduced["tp"])
    assert_type(snp.less(x, 0.0), Varying["dp"])
    assert_type(snp.greater_equal(x, w), Varying["dp", "tp"])
    assert_type(snp.negative(x), Varying["dp"])
    assert_type(snp.absolute(x), Varying["dp"])
    assert_type(snp.amax(x, axis=0), Varying["dp"])
    assert_type(snp.power(x, 2), Varying["dp"])
    assert_type(snp.logical_and(x > 0.0, w > 0.0), Varying["dp", "tp"])
    assert_type(snp.matmul(x, w), Varying["dp", "tp"])
    assert_type(snp.take(x, [0, 1]), Varying["dp"])             # a static index
    assert_type(snp.take(w, x), Varying["dp", "tp"])            # a traced index joins its state


def constructors(x: Varying["dp"], r: Reduced["tp"], m: Typed[Varying["dp"], Unreduced["tp"]]) -> None:
    assert_type(snp.zeros((4,)), Invariant)
    assert_type(snp.arange(4), Invariant)
    assert_type(snp.full((4,), 2.0), Invariant)
    assert_type(snp.full((4,), x), Varying["dp"])               # the fill's state joins
    assert_type(snp.zeros_like(x), Varying["dp"])
    assert_type(snp.ones_like(m), Varying["dp"])                # Unreduced dropped
    assert_type(snp.full_like(r, 1.0), Invariant)               # Reduced dropped


def nn(x: Varying["dp"], r: Reduced["tp"]) -> None:
    assert_type(st.nn.relu(x), Varying["dp"])
    assert_type(st.nn.softmax(x, axis=-1), Varying["dp"])
    assert_type(st.nn.one_hot(x, 8), Varying["dp"])
    # JAX types these Reduced but cannot lower them there: bound on the Varying cast
    assert_type(st.nn.sigmoid(r), Varying["tp"])
    assert_type(st.nn.silu(r), Varying["tp"])


def loss_fn(w: Varying["dp"], p: dict[str, Reduced["tp"]], x: Varying["dp"]) -> Varying["dp"]:
    return x


def gradients(i: Invariant, r: Reduced["tp"], x: Varying["dp"]) -> None:
    params = {"a": r}
    # a direct call: each gradient from its argument's state (Invariant in, Invariant out)
    assert_type(st.grad(loss_fn)(i, params, x), Invariant)
    assert_type(st.grad(loss_fn)(x, params, x), Varying["dp"])
    assert_type(st.grad(loss_fn, argnums=1)(x, params, x), dict[str, Unreduced["tp"]])
    _, (gw, gp) = st.value_and_grad(loss_fn, argnums=(0, 1))(i, params, x)
    assert_type(gw, Invariant)
    assert_type(gp, dict[str, Unreduced["tp"]])
    # through a variable too: the function is generic in each parameter's Varying axes
    g = st.grad(loss_fn)
    assert_type(g(i, params, x), Invariant)
    assert_type(g(x, params, x), Varying["dp"])


def layer(x: Varying["dp"], w: Varying["tp"]) -> tuple[Varying["dp"], Invariant]:
    y = st.psum(x @ w, "tp")
    return y, st.psum(y.sum(), "dp")


def boundary(mesh: Any, x: Any, w: Any) -> None:
    f = st.shard_map(layer, mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=(P("dp"), P()))
    f(x, w)
    g = st.shard_map(layer, mesh=mesh, in_specs=(P("dp"), P(None, "tp")), out_specs=P("dp"))
    g(x, w)   # one spec for both outputs: each fits P("dp")


@st.shard_map(mesh=None, in_specs=P("dp"), out_specs=(P(), P("dp")))
def decorated(x: Varying["dp"]) -> tuple[Invariant, Varying["dp"]]:
    return st.pmean(x.sum(), "dp"), x


def call_decorated(x: Any) -> None:
    decorated(x)
