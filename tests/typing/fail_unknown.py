# legs: plugin unknown
"""`spmd-unknown` (the `unknown` leg: `[spmdtyped] unknown = true`): the first place where a
typed value's state is lost, once per value chain, on a model written the way people write one
(an equinox module with jnp / jax.nn inside, `jax.tree.map` lambdas). The `plugin` leg checks
the same file with the key off: nothing is reported (the code is correct; the plugin only
cannot follow it everywhere)."""

from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp

import spmdtyped as st
from spmdtyped import Invariant, Varying

HD = 4


def scale_rows(x):  # no annotations: mypy types its result Any
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)


def biased(x: Varying["dp"], bias: jax.Array) -> Varying["dp"]:
    return x + bias  # E[unknown]: spmd-unknown


class Attention(eqx.Module):
    wq: st.Shard["tp", -1]
    wk: st.Shard["tp", -1]
    wo: st.Shard["tp", -2]
    rope: jax.Array  # no state hint: a field the plugin knows nothing about

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        b, s, _ = x.shape
        q = (x @ self.wq).reshape(b, s, -1, HD)  # E[unknown]: spmd-unknown
        k = (x @ self.wk) * self.rope  # E[unknown]: spmd-unknown
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k.reshape(b, s, -1, HD))
        p = jax.nn.softmax(logits, axis=-1)  # a row: the state is followed, nothing to say
        o = jnp.einsum("bhqk,bkhd->bqhd", p, q).reshape(b, s, -1)
        return jax.lax.psum(o @ self.wo, "tp")


class Norm(eqx.Module):
    g: Invariant

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        return jax.nn.standardize(x, axis=-1) * self.g  # E[unknown]: spmd-unknown


def chain(x: Varying["dp"]) -> Invariant:
    h = scale_rows(x)  # E[unknown]: spmd-unknown
    h2 = h * 2.0  # Any from here: not reported again
    y = x + h2  # the same chain: not reported again
    z = jnp.clip(x, -1.0, 1.0)  # E[unknown]: spmd-unknown
    return st.pmean(jnp.mean(y + z), "dp")


def reduce_grads(grads: dict[str, Any], x: Varying["dp"]) -> dict[str, Any]:
    scaled = jax.tree.map(lambda g: st.pmean(g, "dp"), grads)  # E[unknown]: spmd-unknown
    typed = {"w": x}
    kept = jax.tree.map(lambda g: st.pmean(g, "dp"), typed)  # the leaves are read: nothing lost
    return {**scaled, **kept}
