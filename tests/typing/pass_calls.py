# legs: plugin mypy
"""Across functions, the correct programs of fail_calls.py: helpers with no annotations called
with typed arguments are checked on them and their results keep the states (a bias added after
the reduction, an activation of a reduced value, an equinox module's unannotated `__call__`);
called with plain arrays they stay as mypy types them. Per-example gradients under `jax.vmap`
of a parameter made per-device first, or of an argument that varies, are right (the gradient
function a name, a lambda, a bound method of an equinox / flax nnx module); helpers mapped over
a tree by `jax.tree.map` keep the leaves' states."""

import functools
from typing import Literal, assert_type

import equinox as eqx
import jax
import jax.numpy as jnp
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")
from flax import nnx

import spmdtyped as st
from spmdtyped import Invariant, Varying


def add_bias(h, b):
    return h + b


def swiglu(gate, up):
    return jax.nn.silu(gate) * up


def rms(x, g):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


def countdown(x, n):
    return x if n == 0 else countdown(x * 2.0, n - 1)  # recursion: not followed into itself


def row_parallel(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]], b: Invariant) -> Invariant:
    return add_bias(st.psum(h @ w2, "tp"), b)  # reduce, then the bias


def pre_divided(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]], b: Invariant) -> Invariant:
    return st.psum(add_bias(h @ w2, b / st.axis_size("tp")), "tp")


def states_kept(x: Varying["dp"], g: Invariant) -> Varying["dp"]:
    y = rms(x, g)
    z: Varying["dp"] = countdown(y, 3)
    return st.pmean(add_bias(z, g), "dp") + y


def defined_later(x: Varying["dp"], g: Invariant) -> Varying["dp"]:
    a, b = split_scale(x, g)  # a helper defined below, with locals, a branch, a tuple
    return a + b


def split_scale(x, g, flip=False):
    y = x * g
    if flip:
        return -y, y
    return y, -y


def maybe_reduce(h, b, reduced):
    if reduced:  # a branch: what it does is not reported (it may not run on these arguments)
        return h + b
    return st.psum(h, "tp") + b


def mode(h, b, how):
    if how == "sum":
        return st.psum(h, "tp") + b
    return h + b


def flags(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]], b: Invariant) -> Invariant:
    y: Invariant = maybe_reduce(h @ w2, b, False)  # the literal's branch only: Invariant
    return y + mode(h @ w2, b, "sum")


def plain(x: jax.Array, b: jax.Array) -> jax.Array:
    return add_bias(rms(x, b), b)  # plain arrays: mypy's own Any, as before


class MLP(eqx.Module):
    w_gate: st.Shard["tp", Literal[-1]]
    w_up: st.Shard["tp", Literal[-1]]
    w_down: st.Shard["tp", Literal[-2]]
    b_down: Invariant

    def __call__(self, x):
        h = swiglu(x @ self.w_gate, x @ self.w_up)
        return add_bias(jax.lax.psum(h @ self.w_down, "tp"), self.b_down)


class Block(eqx.Module):
    g: Invariant
    mlp: MLP

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        return x + self.mlp(rms(x, self.g))


def _per_example_loss(p: Varying["dp"], x: Varying["dp"]) -> Varying["dp"]:
    return st.numpy.sin(st.numpy.dot(p, x))


def per_example_grads(params: Invariant, xs: Varying["dp"]) -> Varying["dp"]:
    g = st.grad(_per_example_loss)
    mine = st.pcast(params, "dp", to="varying")  # a per-device copy: no sum over the devices
    jax.vmap(g, in_axes=(None, 0))(mine, xs)
    jax.vmap(functools.partial(g, mine))(xs)
    g_x = st.grad(_per_example_loss, argnums=1)  # the argument that varies
    per_x: Varying["dp"] = jax.vmap(functools.partial(g_x, params))(xs)
    return per_x + jax.vmap(g_x, in_axes=(None, 0))(params, xs)


def per_example_grad(p, x):
    return st.grad(_per_example_loss)(p, x)


def per_example_grad_x(p: Invariant, x: Varying["dp"]) -> Varying["dp"]:
    g = jax.grad(_per_example_loss, argnums=1)  # the argument that varies
    return g(p, x)


def vmapped_functions(params: Invariant, xs: Varying["dp"]) -> None:
    jax.vmap(per_example_grad, in_axes=(None, 0))(st.pcast(params, "dp", to="varying"), xs)
    jax.vmap(per_example_grad_x, in_axes=(None, 0))(params, xs)
    per_example_grad(params, xs)  # not under jax.vmap: the total gradient, right


# jax.tree.map of helpers: the leaves' states flow through them (the result keeps the tree)
def average(g, axis="dp"):
    return jax.lax.pmean(g, axis)


def clip(g, c=1.0):
    return jnp.clip(g, -c, c)


class Dense(eqx.Module):
    w: Invariant
    b: Invariant

    def __call__(self, x):
        return jax.nn.relu(x @ self.w + self.b)


def dense_loss(m: Dense, x: Varying["dp"]) -> Invariant:
    return jax.lax.pmean(jnp.mean(m(x) ** 2), "dp")


def mapped(m: Dense, x: Varying["dp"], w: Varying["dp"]) -> Dense:
    grads = st.grad(dense_loss)(m, x)  # already summed over dp: no average
    clipped = jax.tree.map(clip, grads)
    assert_type(clipped, Dense)  # E[mypy]: assert-type (Any without the plugin)
    per_device = jax.tree.map(lambda g: average(g, "dp"), {"w": w})  # a value that varies
    assert_type(per_device["w"], Invariant)  # E[mypy]: assert-type (Any without the plugin)
    assert_type(jax.tree.map(average, (w, w)), tuple[Invariant, Invariant])  # E[mypy]: assert-type (Any without the plugin)
    return jax.tree.map(lambda p, g: p - 0.1 * clip(g), m, clipped)


# per-example gradients under jax.vmap of a lambda and of bound methods: of a parameter made
# per-device first, or of the argument that varies
def vmapped_lambdas(params: Invariant, xs: Varying["dp"]) -> None:
    mine = st.pcast(params, "dp", to="varying")
    jax.vmap(lambda x: st.grad(_per_example_loss)(mine, x))(xs)
    g_x = jax.grad(_per_example_loss, argnums=1)
    jax.vmap(lambda p, x: g_x(p, x), in_axes=(None, 0))(params, xs)
    per_example = jax.vmap(lambda x: g_x(params, x))
    per_example(xs)


class Trainer(eqx.Module):
    params: Invariant

    def per_example(self, x):
        mine = st.pcast(self.params, "dp", to="varying")
        return st.grad(_per_example_loss)(mine, x)

    def run(self, xs: Varying["dp"]) -> None:
        jax.vmap(self.per_example)(xs)


class NnxTrainer(nnx.Module):
    def __init__(self, params: Invariant) -> None:
        self.params = nnx.Param(params)

    def per_example(self, x):
        g = jax.grad(_per_example_loss, argnums=1)  # the argument that varies
        return g(self.params[...], x)


def vmapped_methods(t: Trainer, n: NnxTrainer, xs: Varying["dp"]) -> None:
    jax.vmap(t.per_example)(xs)
    jax.vmap(n.per_example)(xs)


# a helper's `if` blocks: the one the call's literal arguments choose is checked, another (or
# both, where the flag is no literal: it may be set only for arguments that suit it) is not
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


def decided_branches(h: st.Shard["tp", Literal[-1]], w2: st.Shard["tp", Literal[-2]], b: Invariant,
                     flag: bool) -> Invariant:
    y: Invariant = bias_then_reduce(h @ w2, b)  # the default: reduce first
    y = y + bias_then_reduce(h @ w2, b, False) + by_order(h @ w2, b, "reduce first")
    bias_then_reduce(h @ w2, b, flag)  # a flag no literal decides: its blocks are not reported
    return y + bias_then_reduce(h @ w2, b / st.axis_size("tp"), True)  # the bias pre-divided
