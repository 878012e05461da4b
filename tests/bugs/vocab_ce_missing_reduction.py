"""Vocab-parallel cross-entropy whose softmax denominator is not summed over tp.

Source: Megatron-LM's `_VocabParallelCrossEntropy` (`sum_exp_logits` must be all-reduced over
the tp group); the missing/doubled reduction class of NVIDIA/Megatron-LM#7452.

Bug line: `return jnp.log(jnp.sum(jnp.exp(z), axis=-1)) - target_logit` in `buggy_body`: the
sum runs over the tp-sharded vocab dim, so it is Partial(tp), and `log` of a Partial is taken
before the reduction.

JAX already rejects this program: the loss then varies over tp while `out_specs` says it is
replicated over tp (shard_map's out_specs check), so `JAX_REJECTS` is ValueError.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs import _vocab_ce
from bugs._common import make_mesh

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "Megatron-LM _VocabParallelCrossEntropy; NVIDIA/Megatron-LM#7452"
KIND = "forward"
JAX_REJECTS = ValueError
IN_SPECS = (P("dp", "tp"), P("dp"))           # logits [batch, vocab]: vocab over tp
OUT_SPECS = P("dp")
mesh = make_mesh(MESH_AXES)
make_inputs = _vocab_ce.make_inputs
reference = _vocab_ce.reference


def buggy_body(logits, target):
    z, target_logit = _vocab_ce.shifted_and_target_logit(logits, target)
    return jnp.log(jnp.sum(jnp.exp(z), axis=-1)) - target_logit  # BUG


def fixed_body(logits, target):
    z, target_logit = _vocab_ce.shifted_and_target_logit(logits, target)
    return jnp.log(lax.psum(jnp.sum(jnp.exp(z), axis=-1), "tp")) - target_logit


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
