"""A data-parallel step on a pytree of parameters (dict of NamedTuples); `jax.lax.pmean` of a
pytree."""

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("tp", 4))


class Dense(NamedTuple):
    w: Any  # arrays, or PartitionSpecs in IN_SPECS
    b: Any


IN_SPECS = ({"l1": Dense(P(), P()), "l2": Dense(P(), P())}, P("dp"))
OUT_SPECS = (P(), P())


def _loss(params, x):
    h = jnp.tanh(x @ params["l1"].w + params["l1"].b)
    return jnp.mean((h @ params["l2"].w + params["l2"].b) ** 2)


def step(params, x):
    loss, grads = jax.value_and_grad(lambda p: jax.lax.pmean(_loss(p, x), "dp"))(params)
    new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return new, loss


def step_bug(params, x):
    loss, grads = jax.value_and_grad(_loss)(params, x)
    grads = jax.lax.pmean(grads, "dp")  # BUG: SPMD103
    new = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
    return new, jax.lax.pmean(loss, "dp")


ENTRY, BUGS = "step", ("step_bug",)


def run(mesh, fn, *args):
    return jax.shard_map(fn, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(5), 5)
    params = {"l1": Dense(jax.random.normal(k[0], (8, 16)), jax.random.normal(k[1], (16,))),
              "l2": Dense(jax.random.normal(k[2], (16, 4)), jax.random.normal(k[3], (4,)))}
    rep = NamedSharding(mesh, P())
    return (jax.tree_util.tree_map(lambda a: jax.device_put(a, rep), params),
            jax.device_put(jax.random.normal(k[4], (16, 8)), NamedSharding(mesh, P("dp"))))
