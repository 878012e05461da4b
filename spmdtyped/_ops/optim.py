"""Optimiser helpers that know the states: `st.global_norm` and `st.clip_by_global_norm`.

`optax.clip_by_global_norm` inside `shard_map` computes a different norm on each device (each
sees only its shard of a tp- or FSDP-sharded gradient). Here each leaf's squared norm is
reduced over exactly the axes the leaf is sharded on (Varying: `psum`), a partial leaf
(Unreduced) is reduced to its true value first, and a replicated leaf (Invariant, Reduced) is
counted once, so the norm is the global one on every device and clipping equals the
single-device result. optax is an optional dependency, imported on first use.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from .. import numpy as stnp
from .._errors import error
from .._typed.array import is_typed, typeof, unwrap, wrap
from .collectives import pcast, pmean, psum


def _squared_norm(leaf: Any) -> Any:
    """The squared norm of one leaf's global value, Invariant on every axis the leaf has."""
    x = wrap(leaf)
    t = typeof(x)
    if t.unreduced:  # partial sums: the true value first
        x = psum(x, tuple(sorted(t.unreduced)))
    reduced = tuple(sorted(t.reduced))
    if reduced:  # replicated, typed so that only casts apply: count it once below (pmean)
        x = pcast(x, reduced, to="varying")
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    sq = stnp.sum(x * x)
    sharded = tuple(sorted(t.varying))
    if sharded:
        sq = psum(sq, sharded)
    if reduced:
        sq = pmean(sq, reduced)
    return sq


def global_norm(tree: Any) -> Any:
    """The L2 norm of every leaf of `tree` together, as one global array would have it.

    **Arguments:**

    - `tree`: a pytree of typed values and/or raw JAX values inside `st.shard_map` (e.g. the
      gradients of a model whose parameters are sharded over `tp` or FSDP-sharded over `dp`).

    **Returns:** an Invariant scalar (typed), equal on every device to the norm of the global
    (unsharded, reduced) values: a Varying leaf is summed over its axes, an Unreduced leaf is
    reduced first, an Invariant or Reduced leaf is counted once.

    !!! Example
        ```python
        g_norm = st.global_norm(grads)     # Invariant: the same number on every device
        ```
    """
    leaves = jax.tree_util.tree_leaves(tree, is_leaf=is_typed)
    if not leaves:
        return wrap(jnp.zeros((), jnp.float32))
    total = _squared_norm(leaves[0])
    for leaf in leaves[1:]:
        total = total + _squared_norm(leaf)
    return stnp.sqrt(total)


def _optax() -> Any:
    try:
        import optax
    except ImportError:
        raise error("SPMD504", "st.clip_by_global_norm needs optax, which is not installed",
                    op="st.clip_by_global_norm",
                    fix="pip install 'spmdtyped[ecosystem]'  (or: pip install optax)") from None
    return optax


class ClipByGlobalNormState(NamedTuple):
    """`st.clip_by_global_norm` keeps no state (as optax's)."""


def _scale(leaf: Any, scale: Any) -> Any:
    x = wrap(leaf)
    t = typeof(x)
    s = scale
    if t.unreduced:  # Unreduced * Reduced stays Unreduced (the factor is replicated)
        s = pcast(s, tuple(sorted(t.unreduced)), to="reduced")
    out = x * s.astype(x.dtype)
    return out if is_typed(leaf) else unwrap(out)


def clip_by_global_norm(max_norm: float) -> Any:
    """optax's `clip_by_global_norm` with the global norm of sharded gradients.

    **Arguments:**

    - `max_norm`: the largest global norm the updates may have.

    **Returns:** an `optax.GradientTransformation`; chain it like optax's own
    (`optax.chain(st.clip_by_global_norm(1.0), optax.adamw(1e-3))`). Inside `st.shard_map` the
    norm is `st.global_norm(updates)`, so every device scales by the same factor and the result
    equals the single-device one under dp, tp and FSDP layouts.

    **Raises:** `UsageError` (SPMD504) when optax is not installed.

    !!! Example
        ```python
        opt = optax.chain(st.clip_by_global_norm(1.0), optax.adamw(1e-3))
        ```
    """
    optax = _optax()

    def init_fn(params: Any) -> ClipByGlobalNormState:
        del params
        return ClipByGlobalNormState()

    def update_fn(updates: Any, state: Any, params: Any = None) -> Any:
        del params
        g = global_norm(updates)
        # optax's formula: t if g < max_norm else t / g * max_norm, as one factor
        scale = stnp.where(g < max_norm, 1.0, max_norm / g)
        return jax.tree_util.tree_map(lambda t: _scale(t, scale), updates, is_leaf=is_typed), state

    return optax.GradientTransformation(init_fn, update_fn)
