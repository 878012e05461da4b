"""Row-parallel linear: the bias is added to the partial sums, before the reduction.

Source: huggingface/text-generation-inference#1036 (`TensorParallelRowLinear` adds the bias on
every rank, so it ends up multiplied by the tp degree); the same bug in
GeeeekExplorer/nano-vllm#99, Wenyueh/MinivLLM#80, awslabs/slapo#10, PaddlePaddle/Paddle#35186.

Bug line: `y = h @ w2 + b2` in `buggy_body`: `h @ w2` contracts the tp-sharded hidden dim, so it
is Partial(tp); adding the replicated `b2` adds it once per tp device.
"""

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 2, "tp": 4}
SOURCE = "huggingface/text-generation-inference#1036"
KIND = "forward"
JAX_REJECTS = None
IN_SPECS = (P("dp", None), P(None, "tp"), P("tp"), P("tp", None), P())
OUT_SPECS = P("dp", None)
mesh = make_mesh(MESH_AXES)


def make_inputs():
    return (normal(0, (4, 8)), normal(1, (8, 16)), normal(2, (16,)), normal(3, (16, 8)),
            normal(4, (8,)))


def buggy_body(x, w1, b1, w2, b2):
    h = jax.nn.gelu(x @ w1 + b1)            # column-parallel: h is sharded on its last dim
    y = h @ w2 + b2  # BUG
    return lax.psum(y, "tp")


def fixed_body(x, w1, b1, w2, b2):
    h = jax.nn.gelu(x @ w1 + b1)
    return lax.psum(h @ w2, "tp") + b2      # reduce the partial sums, then add the bias once


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(x, w1, b1, w2, b2):
    return jax.nn.gelu(x @ w1 + b1) @ w2 + b2


