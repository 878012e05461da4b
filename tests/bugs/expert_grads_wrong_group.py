"""Expert-parallel MoE: expert gradients all-reduced over the whole data-parallel world.

Source: the issue's "expert gradients reduced over the wrong group" class. In Megatron, expert
parameters are reduced over the expert-data-parallel group and dense ones over the full
data-parallel group; NVIDIA/Megatron-LM#2263 asks which group is right with EP, and
NVIDIA/Megatron-LM#5916 fixes the grad-norm side of the same EP/TP group confusion.

Bug line: `return lax.psum(g, ("dp", "ep"))` in `buggy_body`: `g` is Shard(ep, 0) (each device
holds the gradient of its own expert), so summing over ep adds the gradients of different
experts together.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 2, "ep": 4}
SOURCE = "Megatron expert-data-parallel groups: NVIDIA/Megatron-LM#2263, #5916"
KIND = "grad"
JAX_REJECTS = None
# experts [E, d, f]; tokens already dispatched: [dp, E, tokens, d] and targets [dp, E, tokens, f]
IN_SPECS = (P("ep"), P("dp", "ep"), P("dp", "ep"))
OUT_SPECS = P("ep")
mesh = make_mesh(MESH_AXES)


def make_inputs():
    return normal(60, (4, 4, 3)), normal(61, (2, 4, 5, 4)), normal(62, (2, 4, 5, 3))


def _local_expert_grad(w, x, y):
    """Gradient of this device's token loss w.r.t. its expert, before any reduction."""
    def loss(w):
        return 0.5 * jnp.sum((x[0, 0] @ w[0] - y[0, 0]) ** 2)
    # Replicated over dp for the computation: the gradient is a per-device partial sum over dp.
    return jax.grad(loss)(lax.pcast(w, "dp", to="varying"))


def buggy_body(w, x, y):
    g = _local_expert_grad(w, x, y)
    return lax.psum(g, ("dp", "ep"))  # BUG


def fixed_body(w, x, y):
    g = _local_expert_grad(w, x, y)
    return lax.psum(g, "dp")              # the expert-data-parallel group only


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(w, x, y):
    def loss(w):
        return 0.5 * jnp.sum((jnp.einsum("iets,esf->ietf", x, w) - y) ** 2)
    return jax.grad(loss)(w)
