# legs: plugin
"""The three mistakes of tests/_llama.py in the equinox block of pass_llama_eqx.py (jnp /
jax.nn / jax.lax inside, docs/ecosystem.md's style; the bias one also through a method and a
helper with no annotations, checked on the call's arguments): mypy with the plugin reports each at its
line with an `spmd-*` code (`# MISTAKE: <name>` marks the line, as in tests/_llama.py)."""

import equinox as eqx
import jax
from pass_llama_eqx import MLP, Block, loss

import spmdtyped as st
from spmdtyped import Invariant, Varying


class MLPNoPsum(MLP):
    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        h = jax.nn.silu(x @ self.w_gate) * (x @ self.w_up)
        return h @ self.w_down  # MISTAKE: no_psum  # E: spmd-out-spec-state


class MLPBiasBeforePsum(MLP):
    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        h = jax.nn.silu(x @ self.w_gate) * (x @ self.w_up)
        return jax.lax.psum(h @ self.w_down + self.b_down, "tp")  # MISTAKE: bias_before_psum  # E: spmd-partial-plus-replicated


class MLPBiasBeforePsumInMethod(MLP):
    def down(self, h):  # a method with no annotations: checked where it is called
        return h @ self.w_down + self.b_down

    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        h = jax.nn.silu(x @ self.w_gate) * (x @ self.w_up)
        return jax.lax.psum(self.down(h), "tp")  # MISTAKE: bias_before_psum  # E: spmd-partial-plus-replicated


def down_with_bias(mlp, h):  # a helper with no annotations: the same
    return h @ mlp.w_down + mlp.b_down


class MLPBiasBeforePsumInHelper(MLP):
    def __call__(self, x: Varying["dp"]) -> Varying["dp"]:
        h = jax.nn.silu(x @ self.w_gate) * (x @ self.w_up)
        return jax.lax.psum(down_with_bias(self, h), "tp")  # MISTAKE: bias_before_psum  # E: spmd-partial-plus-replicated


def step_pmean_reduced_grads(block: Block, x: Varying["dp"]
                             ) -> tuple[Invariant, st.Shard["tp", -2]]:
    def loss_of_w_down(w: st.Shard["tp", -2]) -> Invariant:
        return loss(eqx.tree_at(lambda b: b.mlp.w_down, block, w), x)

    value, g = st.value_and_grad(loss_of_w_down)(block.mlp.w_down)
    return value, jax.lax.pmean(g, "dp")  # MISTAKE: pmean_reduced_grads  # E: spmd-invariant-operand


def activation_of_a_partial_sum(block: Block, x: Varying["dp"]) -> Varying["dp"]:
    h = jax.nn.silu(x @ block.mlp.w_gate)
    return jax.lax.psum(jax.nn.gelu(h @ block.mlp.w_down), "tp")  # E: spmd-partial-nonlinear
