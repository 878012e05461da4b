# legs: plugin mypy
"""Across functions: the mistakes the plugin finds inside the user's own helpers, reported at
the call that gives them typed arguments (the helpers have no annotations, or `Any` ones: mypy types their results `Any` and checks nothing in them), and per-example
gradients of a replicated parameter under `jax.vmap` whatever the gradient function is bound
to. Plain mypy (the `mypy` leg) sees none of it and reports nothing."""

import functools
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")

import spmdtyped as st
from spmdtyped import Invariant, Varying


def add_bias(h, b):
    return h + b  # a replicated bias added to a partial sum


def annotated_add_bias(h: Any, b: Any) -> Any:
    return h + b


def gelu_of(h):
    return jax.nn.gelu(h)  # nonlinear on a partial sum


def tanh_of(h):
    return jnp.tanh(h)


def down_then_bias(h, w, b):
    return add_bias(h @ w, b)  # a helper's helper: followed (3 deep at most)


def row_parallel(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]], b: Invariant) -> Invariant:
    return st.psum(add_bias(h @ w2, b), "tp")  # E: spmd-partial-plus-replicated


def row_parallel_annotated(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]], b: Invariant) -> Invariant:
    return st.psum(annotated_add_bias(h @ w2, b), "tp")  # E: spmd-partial-plus-replicated


def activation_of_partial(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]]) -> Invariant:
    return st.psum(gelu_of(h @ w2), "tp")  # E: spmd-partial-nonlinear


def through_two(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]], b: Invariant) -> Invariant:
    return st.psum(down_then_bias(h, w2, b), "tp")  # E: spmd-partial-plus-replicated


def result_state_followed(x: Varying["dp"]) -> Invariant:
    return tanh_of(x)  # E: spmd-out-spec-state


def defined_later(x: Varying["dp"], g: Invariant) -> Invariant:
    a, _ = split_scale(x, g)
    return a  # E: spmd-out-spec-state


def split_scale(x, g, flip=False):
    y = x * g
    if flip:
        return -y, y
    return y, -y


class MLP(eqx.Module):
    w_up: st.Shard["tp", Literal[-1]]
    w_down: st.Shard["tp", Literal[-2]]
    b_down: Invariant

    def __call__(self, x):  # no annotations: checked at each call with typed arguments
        h = jax.nn.silu(x @ self.w_up)
        return jax.lax.psum(add_bias(h @ self.w_down, self.b_down), "tp")


class Block(eqx.Module):
    mlp: MLP

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        return x + self.mlp(x)  # E: spmd-partial-plus-replicated


# per-example gradients of a replicated parameter under jax.vmap (SPMD407), the gradient
# function bound to a name, through functools.partial, and JAX's own jax.grad of a typed loss
def _per_example_loss(p: Varying["dp"], x: Varying["dp"]) -> Varying["dp"]:
    return st.numpy.sin(st.numpy.dot(p, x))


def per_example_grads(params: Invariant, xs: Varying["dp"]) -> None:
    g = st.grad(_per_example_loss)
    jax.vmap(g, in_axes=(None, 0))(params, xs)  # E: spmd-vmap-grad-invariant
    jax.vmap(functools.partial(st.grad(_per_example_loss), params))(xs)  # E: spmd-vmap-grad-invariant
    bound = functools.partial(g, params)
    jax.vmap(bound)(xs)  # E: spmd-vmap-grad-invariant
    jax.vmap(jax.grad(_per_example_loss), in_axes=(None, 0))(params, xs)  # E: spmd-vmap-grad-invariant
    jg = jax.value_and_grad(_per_example_loss)
    jax.vmap(jg, in_axes=(None, 0))(params, xs)  # E: spmd-vmap-grad-invariant


def per_example_grad(p, x):  # vmapped below: its gradient is per-example
    return st.grad(_per_example_loss)(p, x)


def per_example_grad_named(p: Invariant, x: Varying["dp"]) -> Varying["dp"]:
    g = jax.grad(_per_example_loss)
    return g(p, x)


def vmapped_functions(params: Invariant, xs: Varying["dp"]) -> None:
    jax.vmap(per_example_grad, in_axes=(None, 0))(params, xs)  # E: spmd-vmap-grad-invariant
    jax.vmap(per_example_grad_named, in_axes=(None, 0))(params, xs)  # E: spmd-vmap-grad-invariant
