"""Data-parallel SGD step: replicated parameters, batch sharded over dp."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IN_SPECS = (P(), P(), P("dp"), P("dp"))
OUT_SPECS = (P(), P(), P())
LR = 0.1


def _local_loss(w, b, x, y):
    pred = jnp.tanh(x @ w + b)
    return jnp.mean((pred - y) ** 2)


def step(w, b, x, y):
    def loss_fn(w, b):
        return lax.pmean(_local_loss(w, b, x, y), "dp")

    loss, (gw, gb) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w, b)
    return w - LR * gw, b - LR * gb, loss


def step_bug_pmean_grads(w, b, x, y):
    # pre-vma habit: grads of replicated params are already summed over dp by JAX
    loss, (gw, gb) = jax.value_and_grad(_local_loss, argnums=(0, 1))(w, b, x, y)
    gw, gb = lax.pmean((gw, gb), "dp")  # BUG: SPMD103
    return w - LR * gw, b - LR * gb, lax.pmean(loss, "dp")


def step_bug_double_psum(w, b, x, y):
    def loss_fn(w, b):
        return lax.psum(_local_loss(w, b, x, y), "dp")

    loss, (gw, gb) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w, b)
    loss = lax.psum(loss, "dp") / 2  # BUG: SPMD103
    return w - LR * gw, b - LR * gb, loss


BUGS = {"step_bug_pmean_grads": (IN_SPECS, OUT_SPECS), "step_bug_double_psum": (IN_SPECS, OUT_SPECS)}
MAIN = "step"


def build(mesh):
    return jax.shard_map(step, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(0), 4)
    raw = (jax.random.normal(k[0], (8, 4)), jax.random.normal(k[1], (4,)),
           jax.random.normal(k[2], (8, 8)), jax.random.normal(k[3], (8, 4)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
