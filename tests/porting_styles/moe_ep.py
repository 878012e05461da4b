"""Expert parallelism: tokens dispatched to experts with `jax.lax.all_to_all` over `ep`."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("ep", 4))
EP = 4
IN_SPECS = (P(("dp", "ep")), P("ep"))
OUT_SPECS = P(("dp", "ep"))


def moe(x, experts):
    # x: [tokens, d] per device, split into EP groups; experts: [1, d, d] per device
    groups = x.reshape(EP, -1, x.shape[-1])
    routed = jax.lax.all_to_all(groups, "ep", 0, 0, tiled=False)
    out = jnp.einsum("gtd,de->gte", routed, experts[0])
    back = jax.lax.all_to_all(out, "ep", 0, 0, tiled=False)
    return back.reshape(x.shape)


def moe_bug(x, experts):
    groups = x.reshape(EP, -1, x.shape[-1])
    routed = jax.lax.all_to_all(groups, "ep", 0, 0, tiled=False)
    out = jnp.einsum("gtd,de->gte", routed, experts[0])
    combined = jax.lax.psum(out, "ep")
    back = jax.lax.all_to_all(combined, "ep", 0, 0, tiled=False)  # BUG: SPMD103
    return back.reshape(x.shape)


ENTRY, BUGS = "moe", ("moe_bug",)


def run(mesh, fn, *args):
    return jax.shard_map(fn, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(9), 2)
    raw = (jax.random.normal(k[0], (64, 8)), 0.1 * jax.random.normal(k[1], (4, 8, 8)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
