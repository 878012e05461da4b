"""Megatron MLP: column-parallel then row-parallel matmul, one psum over tp."""

import jax
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IN_SPECS = (P("dp", None), P(None, "tp"), P("tp"), P("tp", None))
OUT_SPECS = P("dp", None)


def mlp(x, w1, b1, w2):
    h = jax.nn.gelu(x @ w1 + b1)
    return lax.psum(h @ w2, "tp")


def mlp_bug_missing_psum(x, w1, b1, w2):  # BUG: SPMD401
    h = jax.nn.gelu(x @ w1 + b1)
    return h @ w2


BUGS = {"mlp_bug_missing_psum": (IN_SPECS, OUT_SPECS)}
MAIN = "mlp"


def build(mesh):
    return jax.shard_map(mlp, mesh=mesh, in_specs=(P("dp", None), P(None, "tp"), P("tp"), P("tp", None)),
                         out_specs=P("dp", None))


def make_args(mesh):
    k = jax.random.split(jax.random.key(1), 4)
    raw = (jax.random.normal(k[0], (4, 8)), jax.random.normal(k[1], (8, 16)),
           jax.random.normal(k[2], (16,)), jax.random.normal(k[3], (16, 8)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
