"""Megatron MLP in the style of JAX's docs: `jax.set_mesh` + `@jax.shard_map(out_specs=...)`,
in_specs inferred from the arguments' shardings, `jax.lax.psum` calls."""

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("tp", 4))
IN_SPECS = (P("dp"), P(None, "tp"), P("tp", None))
OUT_SPECS = P("dp")


@jax.shard_map(out_specs=OUT_SPECS)
def mlp(x, w1, w2):
    h = jax.nn.gelu(x @ w1)
    return jax.lax.psum(h @ w2, "tp")


@jax.shard_map(out_specs=OUT_SPECS)
def mlp_bug_double_psum(x, w1, w2):
    h = jax.lax.psum(jax.nn.gelu(x @ w1) @ w2, "tp")
    return jax.lax.psum(h, "tp")  # BUG: SPMD103


ENTRY, BUGS = "mlp", ("mlp_bug_double_psum",)


SET_MESH = True  # the harness calls run() inside `with jax.set_mesh(mesh):`


def run(mesh, fn, *args):
    return fn(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(1), 3)
    raw = (jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (16, 32)),
           jax.random.normal(k[2], (32, 16)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
