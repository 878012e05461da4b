"""Softmax over a vocab dim sharded over tp, with neither the max nor the sum reduced.

Source: vocab-parallel sampling / distillation code that applies `softmax` to the local logits
of a vocab-parallel LM head (Megatron-LM's vocab-parallel CE and TGI/vLLM's sharded LM heads
reduce both the max and the sum over the tp group; missing them normalises each shard to 1).

Bug line: `return jax.nn.softmax(logits, axis=-1)` in `buggy_body`: the normalising sum runs
over the local shard of the Shard(tp, -1) vocab dim (a Partial(tp) divisor).
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "vocab-parallel LM head softmax (Megatron-LM vocab-parallel CE, TGI sharded lm_head)"
KIND = "forward"
JAX_REJECTS = None
IN_SPECS = P("dp", "tp")                      # logits [tokens, vocab]: vocab over tp
OUT_SPECS = P("dp", "tp")
mesh = make_mesh(MESH_AXES)


def make_inputs():
    return (2.0 * normal(110, (4, 16)),)


def buggy_body(logits):
    return jax.nn.softmax(logits, axis=-1)  # BUG


def fixed_body(logits):
    e = jnp.exp(logits - lax.pmax(jnp.max(logits, axis=-1, keepdims=True), "tp"))
    return e / lax.psum(jnp.sum(e, axis=-1, keepdims=True), "tp")


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(logits):
    return jax.nn.softmax(logits, axis=-1)
