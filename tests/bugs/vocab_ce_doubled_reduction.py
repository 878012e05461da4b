"""Vocab-parallel cross-entropy whose (already tp-replicated) loss is summed over tp again.

Source: the doubled-reduction class of NVIDIA/Megatron-LM#7452 (a value that a vocab-parallel
op already reduced over tp is all-reduced over tp a second time, e.g. by a generic
"all-reduce the loss over the model-parallel group" step).

Bug line: `return lax.psum(..., "tp")` in `buggy_body`: after the psums inside the loss, the
per-token loss is Invariant over tp; JAX accepts a psum of an Invariant value and multiplies
it by the axis size. (spmdtyped's four-state rules already reject an axis op on an Invariant
value; the Shard/Partial refinement is not needed for this one.)
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs import _vocab_ce
from bugs._common import make_mesh

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "NVIDIA/Megatron-LM#7452 (doubled reduction)"
KIND = "forward"
JAX_REJECTS = None
IN_SPECS = (P("dp", "tp"), P("dp"))
OUT_SPECS = P("dp")
mesh = make_mesh(MESH_AXES)
make_inputs = _vocab_ce.make_inputs
reference = _vocab_ce.reference


def _ce(logits, target):
    z, target_logit = _vocab_ce.shifted_and_target_logit(logits, target)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(z), axis=-1), "tp")) - target_logit


def buggy_body(logits, target):
    return lax.psum(_ce(logits, target), "tp")  # BUG


def fixed_body(logits, target):
    return _ce(logits, target)


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
