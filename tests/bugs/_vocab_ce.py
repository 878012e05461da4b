"""Megatron's vocab-parallel cross-entropy, the pieces shared by the two CE bug programs."""

import jax
import jax.numpy as jnp
from jax import lax

from bugs._common import normal

BATCH, VOCAB = 4, 16


def make_inputs():
    logits = 3.0 * normal(70, (BATCH, VOCAB))
    target = jax.random.randint(jax.random.key(71), (BATCH,), 0, VOCAB)
    return logits, target


def shifted_and_target_logit(logits, target):
    """Logits shifted by the global max, and the target's shifted logit (summed over tp)."""
    z = logits - lax.pmax(jnp.max(logits, axis=-1, keepdims=True), "tp")
    v = logits.shape[-1]                                   # this device's slice of the vocab
    local = target - lax.axis_index("tp") * v
    owned = (local >= 0) & (local < v)
    picked = jnp.take_along_axis(z, jnp.clip(local, 0, v - 1)[:, None], axis=-1)[:, 0]
    return z, lax.psum(jnp.where(owned, picked, 0.0), "tp")


def reference(logits, target):
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), target[:, None], axis=-1)[:, 0]
