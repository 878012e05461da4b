"""Data-parallel loss with a `functools.partial` body (a static hyperparameter bound)."""

import functools

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("tp", 4))
IN_SPECS = (P(), P("dp"), P("dp"))
OUT_SPECS = (P(), P())


def loss_and_grad(w, x, y, *, temperature):
    def loss_fn(w):
        logits = (x @ w) / temperature
        return jax.lax.pmean(jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[:, 0] * y), "dp")

    return jax.value_and_grad(loss_fn)(w)


def loss_and_grad_bug(w, x, y, *, temperature):
    def loss_fn(w):
        logits = (x @ w) / temperature
        return jax.lax.pmean(jnp.mean(jax.nn.logsumexp(logits, axis=-1) - logits[:, 0] * y), "dp")

    loss, g = jax.value_and_grad(loss_fn)(w)
    return loss, jax.lax.pmean(g, "dp")  # BUG: SPMD103


def body(fn):
    return functools.partial(fn, temperature=0.5)


def build(fn, mesh=None):
    return jax.shard_map(body(fn), mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


ENTRY, BUGS = "loss_and_grad", ("loss_and_grad_bug",)


def run(mesh, fn, *args):
    return build(fn, mesh)(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(2), 3)
    raw = (jax.random.normal(k[0], (8, 4)), jax.random.normal(k[1], (16, 8)),
           jax.random.normal(k[2], (16,)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
