"""Token-level loss averaged as a mean of per-device means when the shards hold unequal counts.

Source: the gradient-accumulation / data-parallel loss bug fixed in
huggingface/transformers#34191 ("mean of means" over micro-batches or devices with different
numbers of non-padding tokens), here across data-parallel devices.

Bug line: `return lax.pmean(...)` in `buggy_body`: `jnp.sum(mask)` sums over the local shard of
the dp-sharded batch, so the divisor is Partial(dp) and the per-device means are averaged with
equal weights.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh

MESH_AXES = {"dp": 8}
SOURCE = "huggingface/transformers#34191"
KIND = "forward"
JAX_REJECTS = None
IN_SPECS = (P("dp", None), P("dp", None))     # [batch, seq], batch over dp
OUT_SPECS = P()
mesh = make_mesh(MESH_AXES)


def make_inputs():
    # Later shards hold longer, harder sequences, as with length-bucketed batches.
    tok_loss = jax.random.uniform(jax.random.key(20), (16, 6), dtype="float32")
    tok_loss = tok_loss * (1.0 + jnp.arange(16, dtype="float32")[:, None] / 4)
    lengths = jnp.array([1, 2] * 4 + [6, 5] * 4)
    mask = (jnp.arange(6)[None, :] < lengths[:, None]).astype("float32")
    return tok_loss, mask


def buggy_body(tok_loss, mask):
    return lax.pmean(jnp.sum(tok_loss * mask) / jnp.sum(mask), "dp")  # BUG


def fixed_body(tok_loss, mask):
    return lax.psum(jnp.sum(tok_loss * mask), "dp") / lax.psum(jnp.sum(mask), "dp")


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(tok_loss, mask):
    return jnp.sum(tok_loss * mask) / jnp.sum(mask)
