"""FSDP: parameters sharded over `fsdp`, all-gathered for the forward pass; the gradient of the
gather is a reduce-scatter (`jax.lax.all_gather` / autodiff)."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("fsdp", 2), ("tp", 4))
IN_SPECS = (P("fsdp"), P("fsdp"), P(("fsdp", "tp")))
OUT_SPECS = (P(), P("fsdp"), P("fsdp"))


def train_step(w1, w2, x):
    def loss_fn(w1, w2):
        f1 = jax.lax.all_gather(w1, "fsdp", tiled=True)
        f2 = jax.lax.all_gather(w2, "fsdp", tiled=True)
        h = jax.nn.relu(x @ f1) @ f2
        return jax.lax.pmean(jnp.mean(h ** 2), ("fsdp", "tp"))

    loss, (g1, g2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2)
    return loss, w1 - 0.1 * g1, w2 - 0.1 * g2


def train_step_bug(w1, w2, x):
    def loss_fn(w1, w2):
        f1 = jax.lax.all_gather(w1, "fsdp", tiled=True)
        f2 = jax.lax.all_gather(w2, "fsdp", tiled=True)
        h = jax.nn.relu(x @ f1) @ f2
        return jax.lax.pmean(jnp.mean(h ** 2), ("fsdp", "tp"))

    loss, (g1, g2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2)
    g1 = jax.lax.psum(g1, "tp")  # BUG: SPMD103
    return loss, w1 - 0.1 * g1, w2 - 0.1 * g2


ENTRY, BUGS = "train_step", ("train_step_bug",)


def run(mesh, fn, *args):
    return jax.shard_map(fn, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(8), 3)
    raw = (0.1 * jax.random.normal(k[0], (8, 16)), 0.1 * jax.random.normal(k[1], (16, 8)),
           jax.random.normal(k[2], (16, 8)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
