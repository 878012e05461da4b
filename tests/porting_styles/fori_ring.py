"""A ring all-reduce over tp written with `jax.lax.ppermute` in a `jax.lax.fori_loop`."""

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("tp", 4))
IN_SPECS = (P("dp", "tp"),)
OUT_SPECS = P("dp")
TP = 4
PERM = [(i, (i + 1) % TP) for i in range(TP)]


def ring_sum(x):
    def body(_, carry):
        acc, msg = carry
        msg = jax.lax.ppermute(msg, "tp", PERM)
        return acc + msg, msg

    acc, _ = jax.lax.fori_loop(0, TP - 1, body, (x, x))
    return jax.lax.psum(acc, "tp") / TP


def ring_sum_bug(x):
    total = jax.lax.psum(x, "tp")

    def body(_, carry):
        acc, msg = carry
        msg = jax.lax.ppermute(msg, "tp", PERM)  # BUG: SPMD103
        return acc + msg, msg

    # JAX rejects the program here (the carry leaves the body varying over tp): the raw
    # tools report JAX's error, translated, at this line
    acc, _ = jax.lax.fori_loop(0, TP - 1, body, (total, total))  # REJECTED: SPMD302
    return acc


ENTRY, BUGS = "ring_sum", ("ring_sum_bug",)


def run(mesh, fn, *args):
    return jax.shard_map(fn, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(*args)


def make_args(mesh):
    x = jax.random.normal(jax.random.key(6), (8, 16))
    return (jax.device_put(x, NamedSharding(mesh, P("dp", "tp"))),)
