# legs: plugin
"""Rule errors on JAX's own spellings of the rows: the same codes as the `st.numpy` / `st.nn` /
`st.*` forms (pass_jnp.py has the accepted ones)."""

import jax
import jax.numpy as jnp
from jax import lax

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Unreduced, Varying


def nonlinear(u: Unreduced["tp"], r: Reduced["tp"], x: Varying["dp"]) -> None:
    jnp.exp(u)  # E: spmd-nonlinear-unreduced
    jax.nn.relu(u)  # E: spmd-nonlinear-unreduced
    jax.nn.softmax(r, axis=-1)  # E: spmd-reduced-replicated
    jax.lax.rsqrt(u)  # E: spmd-nonlinear-unreduced
    jnp.subtract(u, x)  # E: spmd-unreduced-mismatch
    jnp.einsum("ij,jk->ik", u, u)  # E: spmd-unreduced-mismatch
    jnp.tril(u)  # E: spmd-nonlinear-unreduced


def collectives(x: Varying["dp"], r: Reduced["tp"], i: Invariant) -> None:
    jax.lax.psum(x, "tp")  # E: spmd-invariant-operand
    lax.pmean(st.psum(x, "dp"), "dp")  # E: spmd-invariant-operand
    jax.lax.psum(r, "tp")  # E: spmd-reduced-operand
    jax.lax.all_gather(i, "dp")  # E: spmd-invariant-operand


def constants(u: Unreduced["tp"]) -> None:
    u + jnp.ones(4)  # E: spmd-unreduced-mismatch
    mask = jnp.tril(jnp.ones((4, 4), dtype=bool))
    jnp.where(mask, u, 0.0)  # E: spmd-nonlinear-unreduced
