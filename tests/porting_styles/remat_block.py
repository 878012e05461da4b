"""Tensor-parallel residual blocks under `jax.checkpoint`, forward and backward."""

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

AXES = (("dp", 2), ("tp", 4))
IN_SPECS = (P(None, "tp"), P("tp", None), P("dp"))
OUT_SPECS = (P(), P(None, "tp"), P("tp", None))


@jax.checkpoint
def block(w1, w2, h):
    return h + jax.lax.psum(jax.nn.relu(h @ w1) @ w2, "tp")


@jax.checkpoint
def block_bug(w1, w2, h):
    out = h + jax.lax.psum(jax.nn.relu(h @ w1) @ w2, "tp")
    return jax.lax.psum(out, "tp") / 4  # BUG: SPMD103


def _train(blk):
    def step(w1, w2, x):
        def loss_fn(w1, w2):
            h = x
            for _ in range(3):
                h = blk(w1, w2, h)
            return jax.lax.pmean(jnp.mean(h ** 2), "dp")

        loss, (g1, g2) = jax.value_and_grad(loss_fn, argnums=(0, 1))(w1, w2)
        return loss, g1, g2

    return step


step = _train(block)
step_bug = _train(block_bug)
ENTRY, BUGS = "step", ("step_bug",)
BUG_LINES = {"step_bug": "block_bug"}


def run(mesh, fn, *args):
    return jax.shard_map(fn, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)(*args)


def make_args(mesh):
    k = jax.random.split(jax.random.key(3), 3)
    raw = (0.1 * jax.random.normal(k[0], (8, 16)), 0.1 * jax.random.normal(k[1], (16, 8)),
           jax.random.normal(k[2], (4, 8)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
