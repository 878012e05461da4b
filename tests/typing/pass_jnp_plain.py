# legs: mypy
"""JAX's own spellings without the plugin: no crash, JAX's plain types. JAX's stubs declare
`ArrayLike` parameters, which a typed value is not for a checker (it is an array to JAX at
runtime): each typed argument is mypy's `arg-type` (`list-item` in a list), and every result
is JAX's declared `jax.Array` (`Any` for jax.lax's untyped collectives). pass_jnp.py has the
same forms under the plugin."""

from typing import Any, assert_type

import jax
import jax.numpy as jnp
import numpy as np
from axes import dp, tp  # noqa: F401  (the vocabulary: resolves "dp" and "tp")

from spmdtyped import SArray, Unreduced, Varying

Arr = SArray[Any, Any, Any]


def typed_arguments(x: Varying["dp"], w: Varying["tp"], u: Unreduced["tp"]) -> None:
    assert_type(jnp.exp(x), jax.Array)  # E[mypy]: arg-type
    assert_type(jnp.maximum(x, w), jax.Array)  # E[mypy]: arg-type E[mypy]: arg-type
    assert_type(jax.nn.gelu(x), jax.Array)  # E[mypy]: arg-type
    assert_type(jax.lax.rsqrt(x), jax.Array)  # E[mypy]: arg-type
    assert_type(jnp.einsum("bd,df->bf", x, w), jax.Array)  # einsum's operands are untyped
    assert_type(jnp.concatenate([x, x]), jax.Array)  # E[mypy]: list-item E[mypy]: list-item
    assert_type(jnp.split(x, 2), list[jax.Array])  # E[mypy]: arg-type
    assert_type(jax.lax.psum(u, "tp"), Any)
    assert_type(jax.lax.pmean(x, "dp"), Any)


def constants(x: Varying["dp"]) -> None:
    """A constant operand of a typed operator: the operator's plain result."""
    mask = jnp.tril(jnp.ones((4, 4), dtype=bool))
    assert_type(mask, jax.Array)
    assert_type(x + jnp.ones(4), Arr)
    assert_type(x * np.arange(4.0), Arr)


def plain(a: jax.Array) -> None:
    assert_type(jnp.exp(a), jax.Array)
    assert_type(jnp.where(a > 0, a, 0.0), jax.Array)
    assert_type(jax.lax.psum(a, "tp"), Any)
