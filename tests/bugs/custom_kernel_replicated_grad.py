"""A custom kernel (opaque forward and backward, custom_vjp) with a replicated input.

Source: flatironinstitute/jax-finufft#226 (`nufft2` gradient w.r.t. the replicated uniform
grid is wrong under shard_map while the forward is exact; fixed in #232 by giving the
replicated inputs varying-axis information, i.e. pvary'ing them, so that JAX inserts the
cross-device sum of their cotangents).

The kernel is a host callback, as an FFI kernel is: JAX cannot see inside it, so it types its
results Invariant. Its backward returns, for the replicated weight `g`, a per-device partial
cotangent that JAX takes for the finished gradient.

Bug line: the `_kernel(g, x)` call in `buggy_body`: `g` is Invariant, `x` Varying over dp, and
the kernel's cotangent for `g` is a per-device partial sum that nothing reduces.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from bugs._common import make_mesh, normal

MESH_AXES = {"dp": 8}
SOURCE = "flatironinstitute/jax-finufft#226"
KIND = "grad"
JAX_REJECTS = None
IN_SPECS = (P(), P("dp", None))               # weight replicated, points over dp
OUT_SPECS = P()
mesh = make_mesh(MESH_AXES)


def _matvec_host(g, x):
    return np.asarray(x @ g, dtype=np.float32)


def _matvec_t_host(x, ct):
    return np.asarray(x.T @ ct, dtype=np.float32)


def _make_kernel(vary_outputs: bool):
    """`x @ g` as an opaque kernel; `vary_outputs` casts its results to varying over dp."""
    cast = (lambda a: lax.pcast(a, "dp", to="varying")) if vary_outputs else (lambda a: a)

    @jax.custom_vjp
    def kernel(g, x):
        out = jax.ShapeDtypeStruct(x.shape[:1], jnp.float32)
        return cast(jax.pure_callback(_matvec_host, out, g, x, vmap_method="sequential"))

    def fwd(g, x):
        return kernel(g, x), (g, x)

    def bwd(res, ct):
        g, x = res
        spec = jax.ShapeDtypeStruct(g.shape, jnp.float32)
        ct_g = jax.pure_callback(_matvec_t_host, spec, x, ct, vmap_method="sequential")
        ct_x = ct[:, None] * g[None, :]
        # JAX checks the cotangents' varying axes against the primals': cast to match.
        return cast(ct_g), ct_x if vary_outputs else lax.pcast(ct_x, "dp", to="varying")

    kernel.defvjp(fwd, bwd)
    return kernel


_kernel = _make_kernel(vary_outputs=False)
_kernel_varying = _make_kernel(vary_outputs=True)


def _loss(y):
    return lax.psum(jnp.sum(y * y), "dp")


def buggy_body(g, x):
    return _loss(_kernel(g, x))  # BUG


def fixed_body(g, x):
    g = lax.pcast(g, "dp", to="varying")   # jax-finufft#232: the cotangent of g is psummed
    return _loss(_kernel_varying(g, x))


_buggy_fwd = jax.shard_map(buggy_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)
_fixed_fwd = jax.shard_map(fixed_body, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)
buggy = jax.jit(jax.grad(_buggy_fwd))
fixed = jax.jit(jax.grad(_fixed_fwd))


def reference(g, x):
    return jax.grad(lambda g: jnp.sum((x @ g) ** 2))(g)


def make_inputs():
    return normal(90, (4,)), normal(91, (16, 4))
