# legs: plugin mypy
"""The three mistakes of tests/_llama.py in the flax nnx block of pass_llama_nnx.py, whose
`__call__` and helper method have no annotations: mypy with the plugin checks each body on the
typed arguments of its call and reports the mistake at the call with an `spmd-*` code, naming
the method and the line of the mistake (`# MISTAKE: <name>` marks that line, as in
tests/_llama.py); plain mypy sees none of it and reports nothing."""

import jax
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")
from pass_llama_nnx import MLP, Block, loss

import spmdtyped as st
from spmdtyped import Invariant, Varying


class Down(MLP):
    def down(self, h):  # the helper method, here: mypy keeps no body of another module's
        return h @ self.w_down[...]


class MLPNoPsum(Down):
    def __call__(self, x):
        h = jax.nn.silu(x @ self.w_gate[...]) * (x @ self.w_up[...])
        return self.down(h) + self.b_down[...]  # MISTAKE: no_psum


class MLPBiasBeforePsum(Down):
    def __call__(self, x):
        h = jax.nn.silu(x @ self.w_gate[...]) * (x @ self.w_up[...])
        return jax.lax.psum(self.down(h) + self.b_down[...], "tp")  # MISTAKE: bias_before_psum


class MLPBiasInDown(MLP):
    def down(self, h):  # the helper method adds the bias to the partial sum
        return h @ self.w_down[...] + self.b_down[...]  # MISTAKE: bias_before_psum

    def __call__(self, x):
        h = jax.nn.silu(x @ self.w_gate[...]) * (x @ self.w_up[...])
        return jax.lax.psum(self.down(h), "tp")


def forward_no_psum(mlp: MLPNoPsum, x: Varying["dp"]) -> Varying["dp"]:
    return mlp(x)  # E: spmd-partial-plus-replicated


def forward_bias_before_psum(mlp: MLPBiasBeforePsum, x: Varying["dp"]) -> Varying["dp"]:
    return mlp(x)  # E: spmd-partial-plus-replicated


def forward_bias_in_down(mlp: MLPBiasInDown, x: Varying["dp"]) -> Varying["dp"]:
    return mlp(x)  # E: spmd-partial-plus-replicated


def step_pmean_reduced_grads(block: Block, x: Varying["dp"]) -> tuple[Invariant, Block]:
    value, grads = st.value_and_grad(loss)(block, x)
    grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)  # MISTAKE: pmean_reduced_grads  # E: spmd-invariant-operand
    return value, jax.tree.map(lambda p, g: p - 0.1 * g, block, grads)
