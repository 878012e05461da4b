# legs: plugin mypy pyright
# ruff: noqa: F841  (assignments checked for their static errors)
"""Pytree mistakes the plugin reports at their line: a field's state misused in a method, a
`jax.tree.map` lambda that reduces leaves already reduced, a typed value of another state given
to a state-hinted field. Without the plugin (plain mypy, pyright) a state-hinted field does not
take a global array: those constructions are `arg-type` / `reportArgumentType` (marked
`E[mypy]` / `E[pyright]`), and the state mistakes are not seen."""

import equinox as eqx
import jax
import jax.numpy as jnp
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")
from flax import nnx

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Varying


class MLP(eqx.Module):
    w1: Varying["tp"]
    w2: Varying["tp"]
    b: Invariant

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        y = st.psum(x @ self.w1 @ self.w2, "tp")
        return y + st.psum(self.b, "tp")  # E: spmd-invariant-operand


class Dense(nnx.Module):
    def __init__(self, w: Varying["tp"], r: Reduced["tp"]) -> None:
        self.w = w
        self.r = r

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        return st.psum(x @ self.w, "tp") + st.pmean(self.r, "tp")  # E: spmd-reduced-operand


def build() -> tuple[MLP, Dense]:
    w = jnp.ones((4, 4))
    model = MLP(w, w, jnp.zeros(4))  # E[mypy]: arg-type arg-type arg-type E[pyright]: reportArgumentType reportArgumentType reportArgumentType
    return model, Dense(w, w)  # E[mypy]: arg-type arg-type E[pyright]: reportArgumentType reportArgumentType


def loss_fn(m: MLP, x: Varying["dp"]) -> Invariant:
    return st.pmean((m(x) ** 2).mean(), "dp")


def step(model: MLP, x: Varying["dp"], r: Reduced["tp"]) -> MLP:
    grads = st.grad(loss_fn)(model, x)
    # the gradients are already summed over dp (the loss is a pmean): a second reduction
    grads = jax.tree.map(lambda g: st.pmean(g, "dp"), grads)  # E: spmd-invariant-operand
    wrong = MLP(r, model.w2, model.b)  # E: arg-type E[mypy]: arg-type E[pyright]: reportArgumentType
    twice = jax.tree.map(lambda g: st.pmean(g, "dp"), jax.grad(loss_fn)(model, x))  # E: spmd-invariant-operand
    summed: dict[str, Reduced["tp"]] = jax.tree.map(lambda a: st.psum(a, "tp"), {"w": model.w1})  # E: assignment
    return jax.tree.map(lambda p, g: p - 0.1 * g, model, grads)
