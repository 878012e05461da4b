"""Collective matmul: all_gather(x) @ w computed while the row shards of x travel around
the tp ring (ppermute in a fori_loop), overlapping communication with compute."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IN_SPECS = (P("tp", None), P(None, "tp"))
OUT_SPECS = P(None, "tp")


def matmul(x, w):
    n = lax.axis_size("tp")
    idx = lax.axis_index("tp")
    rows = x.shape[0]
    perm = [(j, (j - 1) % n) for j in range(n)]  # after i steps we hold the shard of idx + i
    out = lax.pcast(jnp.zeros((rows * n, w.shape[1]), x.dtype), "tp", to="varying")

    def body(i, carry):
        out, chunk = carry
        src = (idx + i) % n
        out = lax.dynamic_update_slice(out, chunk @ w, (src * rows, 0))
        return out, lax.ppermute(chunk, "tp", perm)

    out, _ = lax.fori_loop(0, n, body, (out, x))
    return out


def matmul_bug_rotate_replicated(x, w):
    n = lax.axis_size("tp")
    perm = [(j, (j - 1) % n) for j in range(n)]
    xs = lax.all_gather(x, "tp", tiled=True, to="invarying")
    nxt = lax.ppermute(xs, "tp", perm)  # BUG: SPMD103
    return (xs + nxt) @ w


BUGS = {"matmul_bug_rotate_replicated": (IN_SPECS, OUT_SPECS)}
MAIN = "matmul"


def build(mesh):
    return jax.shard_map(matmul, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(5), 2)
    raw = (jax.random.normal(k[0], (8, 8)), jax.random.normal(k[1], (8, 16)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
