"""Pipeline parallelism (GPipe-style): one layer per tp device, microbatches shifted
stage to stage with ppermute in a lax.scan; the last stage's outputs are psum'd out."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

IN_SPECS = (P("tp"), P(None, "dp"))
OUT_SPECS = P(None, "dp")


def _run(ws, xs):
    n = lax.axis_size("tp")
    stage = lax.axis_index("tp")
    m = xs.shape[0]
    w = ws[0]
    perm = [(j, j + 1) for j in range(n - 1)]
    state = lax.pcast(jnp.zeros_like(xs[0]), "tp", to="varying")
    outs = lax.pcast(jnp.zeros_like(xs), "tp", to="varying")

    def tick(carry, t):
        state, outs = carry
        inp = jnp.where(stage == 0, xs[jnp.minimum(t, m - 1)], state)
        y = jnp.tanh(inp @ w)
        done = t - (n - 1)
        outs = jnp.where((stage == n - 1) & (done >= 0), outs.at[jnp.maximum(done, 0)].set(y), outs)
        return (lax.ppermute(y, "tp", perm), outs), None

    (_, outs), _ = lax.scan(tick, (state, outs), jnp.arange(m + n - 1))
    return jnp.where(stage == n - 1, outs, 0.0)


def pipeline(ws, xs):
    return lax.psum(_run(ws, xs), "tp")


def pipeline_bug_no_collect(ws, xs):  # BUG: SPMD401
    return _run(ws, xs)


BUGS = {"pipeline_bug_no_collect": (IN_SPECS, OUT_SPECS)}
MAIN = "pipeline"


def build(mesh):
    return jax.shard_map(pipeline, mesh=mesh, in_specs=IN_SPECS, out_specs=OUT_SPECS)


def make_args(mesh):
    k = jax.random.split(jax.random.key(8), 2)
    raw = (0.5 * jax.random.normal(k[0], (4, 8, 8)), jax.random.normal(k[1], (2, 4, 8)))
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, IN_SPECS, strict=True))
