"""Per-sequence loss normalised by the token count of the local sequence shard.

Source: the local-token-count normalisation fixed in huggingface/transformers#34191 (there over
gradient-accumulation micro-batches), in its sequence/context-parallel form: each rank of the
group that shards the sequence divides by its own token count before the cross-rank sum.

Bug line: `return lax.psum(... / jnp.sum(mask, axis=-1), "tp")` in `buggy_body`: each device
divides its partial loss sum by the token count of its own shard of the tp-sharded sequence
dim (a Partial(tp) divisor), then the per-shard means are summed, as a context-parallel rank
that normalises by its local tokens before the gradient all-reduce does.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "huggingface/transformers#34191, sequence-parallel form"
KIND = "forward"
JAX_REJECTS = None
IN_SPECS = (P("dp", "tp"), P("dp", "tp"))     # [batch, seq]: batch over dp, sequence over tp
OUT_SPECS = P("dp")
mesh = make_mesh(MESH_AXES)


def make_inputs():
    tok_loss = jax.random.uniform(jax.random.key(10), (4, 16), dtype="float32")
    # Padding at the end of each sequence, different lengths: the shards hold unequal counts.
    lengths = jnp.array([16, 13, 14, 15])   # the last shard of 4 holds 4, 1, 2, 3 tokens
    mask = (jnp.arange(16)[None, :] < lengths[:, None]).astype("float32")
    return tok_loss, mask


def buggy_body(tok_loss, mask):
    return lax.psum(jnp.sum(tok_loss * mask, axis=-1) / jnp.sum(mask, axis=-1), "tp")  # BUG


def fixed_body(tok_loss, mask):
    num = lax.psum(jnp.sum(tok_loss * mask, axis=-1), "tp")
    den = lax.psum(jnp.sum(mask, axis=-1), "tp")   # the count over the whole sequence
    return num / den


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(tok_loss, mask):
    return jnp.sum(tok_loss * mask, axis=-1) / jnp.sum(mask, axis=-1)
