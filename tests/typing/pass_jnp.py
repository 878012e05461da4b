# legs: plugin
"""JAX's own spellings on typed values (`jnp.*`, `jax.nn.*`, `jax.lax.*`, `jnp.einsum`): the
plugin types each from the surface row of its `st.numpy` / `st.nn` / `st.*` form; array
constants (numpy values, jnp constructors, names bound only to them) are Invariant; calls on
plain arrays keep JAX's `jax.Array`. Without the plugin: pass_jnp_plain.py."""

from typing import Any, assert_type

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from spmdtyped import Invariant, Reduced, Unreduced, Varying


def elementwise(x: Varying["dp"], w: Varying["tp"], u: Unreduced["tp"], r: Reduced["tp"]) -> None:
    assert_type(jnp.exp(x), Varying["dp"])
    assert_type(jnp.maximum(x, w), Varying["dp", "tp"])
    assert_type(jnp.add(u, u), Unreduced["tp"])
    assert_type(jnp.multiply(r, 2.0), Reduced["tp"])
    assert_type(jax.nn.gelu(x), Varying["dp"])
    assert_type(jax.nn.softmax(x, axis=-1), Varying["dp"])
    assert_type(jax.lax.rsqrt(x), Varying["dp"])
    assert_type(lax.neg(x), Varying["dp"])
    assert_type(jnp.einsum("bd,df->bf", x, w), Varying["dp", "tp"])
    assert_type(jnp.concatenate([x, x], axis=-1), Varying["dp"])
    assert_type(jnp.sum(u, axis=0), Unreduced["tp"])
    assert_type(jnp.zeros_like(x), Varying["dp"])
    assert_type(jnp.split(x, 2, axis=-1), list[Varying["dp"]])


def collectives(x: Varying["dp", "tp"], u: Unreduced["tp"]) -> None:
    assert_type(jax.lax.psum(x, "tp"), Varying["dp"])
    assert_type(lax.psum(u, "tp"), Invariant)
    assert_type(jax.lax.pmean(x, ("dp", "tp")), Invariant)
    assert_type(jax.lax.all_gather(x, "tp", axis=1, tiled=True), Varying["dp", "tp"])
    assert_type(jax.lax.ppermute(x, "tp", [(0, 1), (1, 0)]), Varying["dp", "tp"])
    assert_type(jax.lax.psum_scatter(u, "tp", tiled=True), Varying["tp"])


def constants(x: Varying["dp"], s: Varying["dp", "tp"]) -> None:
    assert_type(x + jnp.ones(4), Varying["dp"])
    assert_type(jnp.ones(4) * x, Varying["dp"])
    assert_type(x * np.arange(4.0), Varying["dp"])
    n = x.shape[-1]
    mask = jnp.tril(jnp.ones((n, n), dtype=bool))             # a causal mask
    assert_type(jnp.where(mask, s, -1e9), Varying["dp", "tp"])
    freqs = 1.0 / (10000.0 ** (jnp.arange(0, n, 2) / n))       # a RoPE table
    angles = jnp.outer(jnp.arange(16), freqs)
    assert_type(x * jnp.cos(angles), Varying["dp"])
    assert_type(jnp.exp(x - jnp.max(x, axis=-1, keepdims=True)), Varying["dp"])


def plain(a: jax.Array, b: Any) -> None:
    """No typed argument: JAX's own results, unchanged."""
    assert_type(jnp.exp(a), jax.Array)
    assert_type(jax.nn.relu(a), jax.Array)
    assert_type(jnp.where(a > 0, a, 0.0), jax.Array)
    assert_type(jnp.ones(4), jax.Array)
    assert_type(jax.lax.psum(a, "tp"), Any)
    assert_type(jnp.exp(b), jax.Array)
    c = jnp.tril(jnp.ones((4, 4)))
    assert_type(c + a, jax.Array)
