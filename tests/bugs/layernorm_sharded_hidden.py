"""LayerNorm statistics over a hidden dim that is sharded over tp.

Source: norms over a TP-sharded hidden dim: OLMo-2's q/k-norm normalises the whole q/k
projection, so vLLM's OLMo-2 `_apply_qk_norm` all-gathers q and k over tp before the norm;
any RMSNorm/LayerNorm placed after a column-parallel layer has the same need.

Bug line: `xc = x - jnp.mean(x, axis=-1, keepdims=True)` in `buggy_body`: the mean runs over the
local shard of the Shard(tp, -1) hidden dim, so it is Partial(tp) (and divided by the local
width), and it is subtracted from a shard before the reduction.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "OLMo-2 q/k-norm under TP (vLLM olmo2 _apply_qk_norm)"
KIND = "forward"
JAX_REJECTS = None
EPS = 1e-5
IN_SPECS = (P("dp", "tp"), P("tp"))           # activations [tokens, hidden], gain [hidden]
OUT_SPECS = P("dp", "tp")
mesh = make_mesh(MESH_AXES)


def make_inputs():
    return 1.0 + normal(100, (4, 16)), 1.0 + 0.1 * normal(101, (16,))


def buggy_body(x, gain):
    xc = x - jnp.mean(x, axis=-1, keepdims=True)  # BUG
    var = jnp.mean(xc * xc, axis=-1, keepdims=True)
    return xc * lax.rsqrt(var + EPS) * gain


def fixed_body(x, gain):
    width = x.shape[-1] * lax.axis_size("tp")              # the global hidden size
    xc = x - lax.psum(jnp.sum(x, axis=-1, keepdims=True), "tp") / width
    var = lax.psum(jnp.sum(xc * xc, axis=-1, keepdims=True), "tp") / width
    return xc * lax.rsqrt(var + EPS) * gain


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(x, gain):
    xc = x - jnp.mean(x, axis=-1, keepdims=True)
    return xc * lax.rsqrt(jnp.mean(xc * xc, axis=-1, keepdims=True) + EPS) * gain
