# legs: plugin mypy
"""Across functions: the mistakes the plugin finds inside the user's own helpers, reported at
the call that gives them typed arguments (the helpers have no annotations, or `Any` ones: mypy types their results `Any` and checks nothing in them), and per-example
gradients of a replicated parameter under `jax.vmap` whatever the gradient function is bound
to (a name, `functools.partial`, a lambda, a bound method of an equinox / flax nnx module); gradients
reduced twice through a helper `jax.tree.map` maps (in a lambda or named itself); a mistake in
the `if` block of a helper that the call's literal arguments choose. Plain mypy (the `mypy` leg) sees none of it and reports nothing."""

import functools
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")
from flax import nnx
from pass_calls import Dense, dense_loss  # an equinox module and its loss (pmean over dp)

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


# gradients mapped over with jax.tree.map: a lambda that calls a helper of the module, and the
# helper named itself (its default axis is the literal it says)
def average(g, axis="dp"):
    return jax.lax.pmean(g, axis)


def reduced_grads_averaged(m: Dense, x: Varying["dp"]) -> None:
    grads = st.grad(dense_loss)(m, x)  # already summed over dp: the loss is a pmean
    jax.tree.map(lambda g: average(g, "dp"), grads)  # E: spmd-invariant-operand
    jax.tree.map(average, grads)  # E: spmd-invariant-operand
    jax.tree.map(lambda g: st.pmean(g, "dp"), grads)  # E: spmd-invariant-operand


# per-example gradients under jax.vmap of a lambda, of a bound method (equinox and flax nnx)
def vmapped_lambdas(params: Invariant, xs: Varying["dp"]) -> None:
    jax.vmap(lambda x: st.grad(_per_example_loss)(params, x))(xs)  # E: spmd-vmap-grad-invariant
    g = jax.grad(_per_example_loss)
    jax.vmap(lambda p, x: g(p, x), in_axes=(None, 0))(params, xs)  # E: spmd-vmap-grad-invariant
    per_example = jax.vmap(lambda x: g(params, x))
    per_example(xs)  # E: spmd-vmap-grad-invariant


class Trainer(eqx.Module):
    params: Invariant

    def per_example(self, x):
        return st.grad(_per_example_loss)(self.params, x)

    def run(self, xs: Varying["dp"]) -> None:
        jax.vmap(self.per_example)(xs)  # E: spmd-vmap-grad-invariant


class NnxTrainer(nnx.Module):
    def __init__(self, params: Invariant) -> None:
        self.params = nnx.Param(params)

    def per_example(self, x):
        g = jax.grad(_per_example_loss)
        return g(self.params[...], x)


def vmapped_methods(t: Trainer, n: NnxTrainer, xs: Varying["dp"]) -> None:
    jax.vmap(t.per_example)(xs)  # E: spmd-vmap-grad-invariant
    jax.vmap(n.per_example)(xs)  # E: spmd-vmap-grad-invariant


# a mistake inside an `if` block of a helper: reported where the call's literal arguments decide
# the branch (its other block unchecked by mypy), and in the body of a `try` (the helpers are
# pass_calls.py's again: only the module's own bodies are followed)
def bias_then_reduce(h, b, bias_first=False):
    if bias_first:
        return st.psum(h + b, "tp")
    return st.psum(h, "tp") + b


def by_order(h, b, order):
    if order == "bias first":
        y = st.psum(h + b, "tp")
    elif order == "reduce first":
        y = st.psum(h, "tp") + b
    else:
        raise ValueError(order)
    return y


def reduce_in_try(h, b):
    try:
        y = h + b
    except ValueError:
        raise
    return st.psum(y, "tp")


def decided_branches(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]], b: Invariant) -> None:
    bias_then_reduce(h @ w2, b, True)  # E: spmd-partial-plus-replicated
    bias_then_reduce(h @ w2, b, bias_first=True)  # E: spmd-partial-plus-replicated
    by_order(h @ w2, b, "bias first")  # E: spmd-partial-plus-replicated
    reduce_in_try(h @ w2, b)  # E: spmd-partial-plus-replicated
