"""Global gradient norm that counts the tp-replicated parameters once per tp device.

Source: NVIDIA-NeMo/RL#3788 (`get_grad_norm` sums every local `|g|^2`, sharded or replicated,
over the tp group), ROCm/TransformerEngine#715 (replicated weights marked tensor-parallel,
grad norm inflated 1.36-1.52x at TP=8), areal-project/AReaL#1497; Megatron's
`clip_grads.py` avoids it with the `tensor_model_parallel` / duplicate-parameter filter.

Bug line: `sq = jnp.sum(g_w * g_w) + jnp.sum(g_ln * g_ln)` in `buggy_body`: the first term sums
a tp-sharded gradient (Partial(tp)), the second a replicated one (Invariant); the psum that
follows adds the replicated term once per tp device.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "NVIDIA-NeMo/RL#3788; ROCm/TransformerEngine#715"
KIND = "forward"
JAX_REJECTS = None
IN_SPECS = (P("tp", None), P())               # grad of a row-parallel weight, grad of a norm weight
OUT_SPECS = P()
mesh = make_mesh(MESH_AXES)


def make_inputs():
    return normal(40, (16, 8)), normal(41, (8,))


def buggy_body(g_w, g_ln):
    sq = jnp.sum(g_w * g_w) + jnp.sum(g_ln * g_ln)  # BUG
    return jnp.sqrt(lax.psum(sq, "tp"))


def fixed_body(g_w, g_ln):
    sq = lax.psum(jnp.sum(g_w * g_w), "tp") + jnp.sum(g_ln * g_ln)   # replicated: counted once
    return jnp.sqrt(sq)


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(g_w, g_ln):
    return jnp.sqrt(jnp.sum(g_w * g_w) + jnp.sum(g_ln * g_ln))
