# legs: plugin
"""A Llama-style block in equinox written as docs/ecosystem.md teaches: jnp / jax.nn / jax.lax
inside the modules, state hints on the fields, the methods and the step, nothing rewritten into
`st.numpy`, a helper and a method with no annotations. mypy with the plugin follows every
state (the column-parallel Shard, the row-parallel partial sum through the unannotated ones, the causal mask of `jnp.tril`, the gradient) and reports nothing;
fail_llama_eqx.py has the three mistakes of tests/_llama.py; tests/test_typing_llama.py runs
this model against a single-device reference (values and gradients). The modules are built
from raw arrays outside the typed code (fields: another item of issue 23)."""

import equinox as eqx
import jax
import jax.numpy as jnp

import spmdtyped as st
from spmdtyped import Invariant, Varying

HD = 4  # the head dimension (tests/_llama.py)


def rms_norm(x: Varying["dp"], g: Invariant) -> Varying["dp"]:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6) * g


class Attention(eqx.Module):
    wq: st.Shard["tp", -1]  # column-parallel: this device's heads
    wk: st.Shard["tp", -1]
    wv: st.Shard["tp", -1]
    wo: st.Shard["tp", -2]  # row-parallel

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        b, s, _ = x.shape
        q = (x @ self.wq).reshape(b, s, -1, HD)
        k = (x @ self.wk).reshape(b, s, -1, HD)
        v = (x @ self.wv).reshape(b, s, -1, HD)
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(float(HD))
        mask = jnp.tril(jnp.ones((s, s), bool))  # a constant: Invariant
        p = jax.nn.softmax(jnp.where(mask, logits, -1e9), axis=-1)
        o = jnp.einsum("bhqk,bkhd->bqhd", p, v).reshape(b, s, -1)
        return jax.lax.psum(o @ self.wo, "tp")


def swiglu(gate, up):  # a helper with no annotations: checked at each call on its arguments
    return jax.nn.silu(gate) * up


class MLP(eqx.Module):
    w_gate: st.Shard["tp", -1]  # column-parallel
    w_up: st.Shard["tp", -1]
    w_down: st.Shard["tp", -2]  # row-parallel: its product is a partial sum over tp
    b_down: Invariant

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        h = swiglu(x @ self.w_gate, x @ self.w_up)
        return jax.lax.psum(self.down(h), "tp") + self.b_down  # reduce, then the bias

    def down(self, h):  # a method with no annotations: the same (its result a partial sum)
        return h @ self.w_down


class Block(eqx.Module):
    g1: Invariant
    g2: Invariant
    attn: Attention
    mlp: MLP

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        x = x + self.attn(rms_norm(x, self.g1))
        return x + self.mlp(rms_norm(x, self.g2))


def loss(block: Block, x: Varying["dp"]) -> Invariant:
    return jax.lax.pmean(jnp.mean(block(x) ** 2), "dp")


def step(block: Block, x: Varying["dp"]) -> tuple[Invariant, st.Shard["tp", -2]]:
    """The loss and its gradient for the row-parallel weight (already summed over dp by JAX's
    transpose of the replicated weight: no pmean)."""

    def loss_of_w_down(w: st.Shard["tp", -2]) -> Invariant:
        return loss(eqx.tree_at(lambda b: b.mlp.w_down, block, w), x)

    value, g = st.value_and_grad(loss_of_w_down)(block.mlp.w_down)
    return value, g
