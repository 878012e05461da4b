"""Attention sinks (one learned logit per head) with the heads sharded over tp.

Source: the attention-sink parameter of gpt-oss-style attention (`sinks[num_heads]`), which a
tensor-parallel port must slice by the tp rank like the heads (the issue's "attention-sink
over TP-sharded heads" class); any per-head parameter (ALiBi slopes, per-head scales) has the
same shape of bug.

Bug line: the `jnp.concatenate` in `buggy_body`: `sinks[:h]` takes the sinks of heads 0..h-1 on
every device (a constant slice of the replicated parameter), while the scores' head dim is
Shard(tp, 1): device k needs heads k*h..k*h+h-1.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "gpt-oss attention sinks under tensor parallelism (per-head parameter, TP heads)"
KIND = "forward"
JAX_REJECTS = None
QKV = P("dp", "tp", None, None)               # [batch, heads, seq, head_dim]
IN_SPECS = (QKV, QKV, QKV, P())
OUT_SPECS = QKV
mesh = make_mesh(MESH_AXES)


def make_inputs():
    b, h, t, d = 2, 8, 4, 4
    return (normal(30, (b, h, t, d)), normal(31, (b, h, t, d)), normal(32, (b, h, t, d)),
            normal(33, (h,)))


def _attend_with_sink(q, k, v, sink_col):
    """Softmax over the keys plus one sink column, which is then dropped (gpt-oss)."""
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    p = jax.nn.softmax(jnp.concatenate([s, sink_col], axis=-1), axis=-1)[..., :-1]
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def buggy_body(q, k, v, sinks):
    b, h, t, _ = q.shape
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / jnp.sqrt(jnp.float32(q.shape[-1]))
    logits = jnp.concatenate([s, jnp.broadcast_to(sinks[:h, None, None], (b, h, t, 1))], -1)  # BUG
    p = jax.nn.softmax(logits, axis=-1)[..., :-1]
    return jnp.einsum("bhqk,bhkd->bhqd", p, v)


def fixed_body(q, k, v, sinks):
    b, h, t, _ = q.shape
    local = lax.dynamic_slice_in_dim(sinks, lax.axis_index("tp") * h, h)   # this device's heads
    return _attend_with_sink(q, k, v, jnp.broadcast_to(local[:, None, None], (b, h, t, 1)))


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(q, k, v, sinks):
    b, h, t, _ = q.shape
    return _attend_with_sink(q, k, v, jnp.broadcast_to(sinks[:, None, None], (b, h, t, 1)))
