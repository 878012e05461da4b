# legs: plugin mypy
"""A Llama-style block in flax nnx written the way flax teaches: the weights are `nnx.Param`s
assigned in `__init__` from parameters hinted with states, `__call__` and a helper method have
no annotations (mypy types their results `Any` and checks nothing in them), jnp / jax.nn /
jax.lax inside, read with `self.w[...]`. mypy with the plugin checks the unannotated bodies at
each call on the call's argument types (the column-parallel Shard, the row-parallel partial sum
through the helper method, the bias after the psum, the causal mask) and reports nothing;
plain mypy reports nothing either. fail_llama_nnx.py has the three mistakes of
tests/_llama.py."""

from typing import Literal

import jax
import jax.numpy as jnp
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")
from flax import nnx

import spmdtyped as st
from spmdtyped import Invariant, Varying

HD = 4  # the head dimension (tests/_llama.py)


def rms_norm(x, g):  # a helper with no annotations: checked at each call on its arguments
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


class Attention(nnx.Module):
    def __init__(self, wq: st.Shard["tp", Literal[-1]], wk: st.Shard["tp", Literal[-1]], wv: st.Shard["tp", Literal[-1]],
                 wo: st.Shard["tp", Literal[-2]]) -> None:
        self.wq = nnx.Param(wq)  # column-parallel: this device's heads
        self.wk = nnx.Param(wk)
        self.wv = nnx.Param(wv)
        self.wo = nnx.Param(wo)  # row-parallel

    def __call__(self, x):
        b, s, _ = x.shape
        q = (x @ self.wq[...]).reshape(b, s, -1, HD)
        k = (x @ self.wk[...]).reshape(b, s, -1, HD)
        v = (x @ self.wv[...]).reshape(b, s, -1, HD)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(HD))
        mask = jnp.tril(jnp.ones((s, s), bool))  # a constant: Invariant
        p = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, -1)
        return jax.lax.psum(o @ self.wo[...], "tp")


class MLP(nnx.Module):
    def __init__(self, w_gate: st.Shard["tp", Literal[-1]], w_up: st.Shard["tp", Literal[-1]],
                 w_down: st.Shard["tp", Literal[-2]], b_down: Invariant) -> None:
        self.w_gate = nnx.Param(w_gate)  # column-parallel
        self.w_up = nnx.Param(w_up)
        self.w_down = nnx.Param(w_down)  # row-parallel: its product is a partial sum over tp
        self.b_down = nnx.Param(b_down)

    def down(self, h):  # a method with no annotations: its result a partial sum over tp
        return h @ self.w_down[...]

    def __call__(self, x):
        h = jax.nn.silu(x @ self.w_gate[...]) * (x @ self.w_up[...])
        return jax.lax.psum(self.down(h), "tp") + self.b_down[...]  # reduce, then the bias


class Block(nnx.Module):
    def __init__(self, g1: Invariant, g2: Invariant, attn: Attention, mlp: MLP) -> None:
        self.g1 = nnx.Param(g1)
        self.g2 = nnx.Param(g2)
        self.attn = attn
        self.mlp = mlp

    def __call__(self, x):
        x = x + self.attn(rms_norm(x, self.g1[...]))
        return x + self.mlp(rms_norm(x, self.g2[...]))


def loss(block: Block, x: Varying["dp"]) -> Invariant:
    return jax.lax.pmean(jnp.mean(block(x) ** 2), "dp")


def step(block: Block, x: Varying["dp"]) -> tuple[Invariant, Block]:
    """The loss and its gradients (already summed over dp by JAX's transpose of the replicated
    weights: no pmean), and the updated block."""
    value, grads = st.value_and_grad(loss)(block, x)
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, block, grads)
