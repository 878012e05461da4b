"""`lax.cond` on `axis_index` of a replicated operand, differentiated.

Source: jax-ml/jax#40823 (cond with a device-varying predicate types its result as replicated
when the operands are; under `grad` the backward reduction then runs inside the branches and
the gradient is wrong: 4 instead of 5 on 2 devices); patrick-kidger/equinox#1262.

Bug line: the `lax.cond(lax.axis_index("tp") == 0, ...)` in `buggy_body`: the predicate varies
over tp while the operand `x` is Invariant, so JAX types the result Invariant.
"""

import jax
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh

MESH_AXES = {"tp": 8}
SOURCE = "jax-ml/jax#40823"
KIND = "grad"
JAX_REJECTS = None
IN_SPECS = P()
OUT_SPECS = P("tp")
mesh = make_mesh(MESH_AXES)


def make_inputs():
    return (jax.numpy.float32(2.0),)


def buggy_body(x):
    y = lax.cond(lax.axis_index("tp") == 0, lambda x: 2 * x, lambda x: 3 * x, x)  # BUG
    return y[None]


def fixed_body(x):
    x = lax.pcast(x, "tp", to="varying")     # vary the operand before the divergent branch
    y = lax.cond(lax.axis_index("tp") == 0, lambda x: 2 * x, lambda x: 3 * x, x)
    return y[None]


_buggy_fwd = jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)
_fixed_fwd = jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)
buggy = jax.jit(jax.grad(lambda x: _buggy_fwd(x).sum()))
fixed = jax.jit(jax.grad(lambda x: _fixed_fwd(x).sum()))


def reference(x):
    """d/dx of sum over the 8 devices of (2x on device 0, 3x elsewhere) = 2 + 7 * 3."""
    def total(x):
        return 2 * x + sum(3 * x for _ in range(MESH_AXES["tp"] - 1))
    return jax.grad(total)(x)
