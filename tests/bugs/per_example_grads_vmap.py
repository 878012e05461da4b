"""Per-example gradients with `vmap(grad)` inside `shard_map`, w.r.t. replicated parameters.

Source: jax-ml/jax#36886 (the per-example gradients come out summed over the devices: the
gradient w.r.t. a replicated (Invariant) parameter of a per-device loss is psummed by JAX's
transpose of the implicit pvary, which is right for a total loss and wrong per example).

Bug line: the `jax.vmap(jax.grad(...))` call in `buggy_body`: `params` is Invariant over dp and
the loss Varying, so each per-example gradient is summed over the 8 devices.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 8}
SOURCE = "jax-ml/jax#36886"
KIND = "grad"
JAX_REJECTS = None
IN_SPECS = (P(), P("dp", None))               # params replicated, samples over dp
OUT_SPECS = P("dp", None)
mesh = make_mesh(MESH_AXES)


def make_inputs():
    return normal(80, (3,)), normal(81, (16, 3))


def net(p, x):
    return jnp.sin(jnp.dot(p, x))


def buggy_body(params, xs):
    return jax.vmap(jax.grad(net), in_axes=(None, 0))(params, xs)  # BUG


def fixed_body(params, xs):
    params = lax.pcast(params, "dp", to="varying")     # per-device copy: no sum over devices
    return jax.vmap(jax.grad(net), in_axes=(None, 0))(params, xs)


buggy = jax.jit(jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))
fixed = jax.jit(jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS))


def reference(params, xs):
    return jax.vmap(jax.grad(net), in_axes=(None, 0))(params, xs)
