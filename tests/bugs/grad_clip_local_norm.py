"""Gradient clipping with a per-device norm of tp-sharded gradients.

Source: the BLOOM tensor-parallel desync (bigscience-workshop/Megatron-DeepSpeed#270, #271,
#307: weights that should be identical on every tp rank drifted apart and had to be forcibly
synced) is the class: tp ranks that compute different clip coefficients update differently.
Here the coefficient comes from the norm of each rank's own shards, as in
meta-pytorch/torchtune#2420 (`clip_grad_norm` with TP) and huggingface/transformers#36132
("grad norms are not same on each rank"). With a replicated parameter in the same clip, JAX's
out_specs check would reject the now tp-varying replicated gradient; with only sharded
gradients, as here, JAX accepts and every shard is clipped by the wrong factor.

Bug line: `norm = jnp.sqrt(...)` in `buggy_body`: the sums run over tp-sharded gradients, so
they are Partial(tp), and the square root is taken before the reduction.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "bigscience-workshop/Megatron-DeepSpeed#271 (BLOOM TP desync); torchtune#2420"
KIND = "forward"
JAX_REJECTS = None
MAX_NORM = 1.0
IN_SPECS = (P(None, "tp"), P("tp", None))     # grads of a column- and a row-parallel weight
OUT_SPECS = (P(None, "tp"), P("tp", None))
mesh = make_mesh(MESH_AXES)


def make_inputs():
    return normal(50, (8, 16)), normal(51, (16, 8))


def buggy_body(g1, g2):
    norm = jnp.sqrt(jnp.sum(g1 * g1) + jnp.sum(g2 * g2))  # BUG
    scale = jnp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    return g1 * scale, g2 * scale


def fixed_body(g1, g2):
    norm = jnp.sqrt(lax.psum(jnp.sum(g1 * g1) + jnp.sum(g2 * g2), "tp"))
    scale = jnp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    return g1 * scale, g2 * scale


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(g1, g2):
    norm = jnp.sqrt(jnp.sum(g1 * g1) + jnp.sum(g2 * g2))
    scale = jnp.minimum(1.0, MAX_NORM / (norm + 1e-6))
    return g1 * scale, g2 * scale
