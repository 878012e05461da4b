"""ZeRO-3 training step: parameters, gradients and updates all sharded over `dp`, typed end to end.

Mesh dp=8. Every device holds 1/8 of each parameter (`Varying["dp"]`) and 1/8 of the batch.
The step gathers each parameter just in time with `st.all_gather(..., to="reduced")`
(`Reduced["dp"]`: replicated, but its gradient stays Unreduced instead of being summed),
differentiates the per-device loss (`Varying["dp"]`) with `st.value_and_grad`, which returns
`Unreduced["dp"]` gradients, reduces them with `st.psum_scatter` straight back to the shard
layout (`Varying["dp"]`), and updates the shards. A second psum of the gradients, or an update
of the full parameter with a shard's gradient, is a type error.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.numpy as snp
from spmdtyped import Invariant, Reduced, Unreduced, Varying

LR = 0.1
PARAM_SPECS = {"w1": P("dp", None), "w2": P("dp", None)}
DATA_SPEC = P("dp", None)


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("dp",))


def loss_fn(params: dict[str, Reduced["dp"]], x: Varying["dp"], y: Varying["dp"]) -> Varying["dp"]:
    h = st.nn.gelu(x @ params["w1"])            # Reduced weight x Varying data: Varying["dp"]
    err = h @ params["w2"] - y
    return snp.mean(err * err)                  # this device's loss: Varying["dp"]


def train_step(shards: dict[str, Varying["dp"]], x: Varying["dp"],
               y: Varying["dp"]) -> tuple[dict[str, Varying["dp"]], Invariant]:
    n = st.axis_size("dp")
    full: dict[str, Reduced["dp"]] = {
        k: st.all_gather(s, "dp", tiled=True, to="reduced") for k, s in shards.items()}
    loss, grads = st.value_and_grad(loss_fn)(full, x, y)
    g: dict[str, Unreduced["dp"]] = grads
    g_shards = {k: st.psum_scatter(v, "dp", tiled=True) for k, v in g.items()}   # Varying["dp"]
    new = {k: shards[k] - (LR / n) * g_shards[k] for k in shards}
    return new, st.pmean(loss, "dp")


def loss_fn_raw(params, x, y):  # type: ignore[no-untyped-def]
    h = jax.nn.gelu(x @ params["w1"])
    err = h @ params["w2"] - y
    return jnp.mean(err * err)


def train_step_raw(shards, x, y):  # type: ignore[no-untyped-def]
    n = jax.lax.axis_size("dp")
    full = {k: jax.lax.all_gather(s, "dp", tiled=True, to="reduced") for k, s in shards.items()}
    loss, grads = jax.value_and_grad(loss_fn_raw)(full, x, y)
    g_shards = {k: jax.lax.psum_scatter(v, "dp", tiled=True) for k, v in grads.items()}
    new = {k: shards[k] - (LR / n) * g_shards[k] for k in shards}
    return new, jax.lax.pmean(loss, "dp")


def reference_step(params, x, y):  # type: ignore[no-untyped-def]
    """The same step on one device: the mean of the 8 per-device losses."""
    def loss(p):  # type: ignore[no-untyped-def]
        per = jax.vmap(loss_fn_raw, in_axes=(None, 0, 0))(p, x.reshape(8, -1, x.shape[-1]),
                                                            y.reshape(8, -1, y.shape[-1]))
        return per.mean()
    value, g = jax.value_and_grad(loss)(params)
    return {k: params[k] - LR * g[k] for k in params}, value


def make_inputs(mesh: jax.sharding.Mesh, batch: int = 16, d: int = 16, hidden: int = 32,  # type: ignore[no-untyped-def]
                out: int = 8):
    ks = jax.random.split(jax.random.key(3), 4)
    params = {"w1": jax.random.normal(ks[0], (d, hidden)) / d**0.5,
              "w2": jax.random.normal(ks[1], (hidden, out)) / hidden**0.5}
    x = jax.random.normal(ks[2], (batch, d))
    y = jax.random.normal(ks[3], (batch, out))
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    return ({k: put(v, PARAM_SPECS[k]) for k, v in params.items()}, put(x, DATA_SPEC),
            put(y, DATA_SPEC))


def programs(mesh: jax.sharding.Mesh):  # type: ignore[no-untyped-def]
    """(typed, raw): the same ZeRO-3 step through st.shard_map and jax.shard_map."""
    in_specs, out_specs = (PARAM_SPECS, DATA_SPEC, DATA_SPEC), (PARAM_SPECS, P())
    return (jax.jit(st.shard_map(train_step, mesh=mesh, in_specs=in_specs, out_specs=out_specs)),
            jax.jit(jax.shard_map(train_step_raw, mesh=mesh, in_specs=in_specs,
                                  out_specs=out_specs)))


def run(verbose: bool = False, steps: int = 3) -> dict[str, float]:
    mesh = make_mesh()
    params, x, y = make_inputs(mesh)
    typed, raw = programs(mesh)
    p_t, p_r = params, params
    ref = {k: np.asarray(v) for k, v in params.items()}
    xs, ys = np.asarray(x), np.asarray(y)
    ref_step = jax.jit(reference_step)
    for _ in range(steps):
        p_t, loss_t = typed(p_t, x, y)
        p_r, loss_r = raw(p_r, x, y)
        for k in p_t:
            assert np.array_equal(np.asarray(p_t[k]), np.asarray(p_r[k])), f"typed != raw ({k})"
        assert np.array_equal(np.asarray(loss_t), np.asarray(loss_r)), "typed != raw (loss)"
        ref, loss_ref = ref_step(ref, xs, ys)
    err = max(float(np.max(np.abs(np.asarray(p_t[k]) - np.asarray(ref[k])))) for k in ref)
    err = max(err, abs(float(loss_t) - float(loss_ref)))
    assert err < 1e-4, err
    if verbose:
        print(f"ZeRO-3: {steps} steps, loss {float(loss_t):.4f}, typed == raw bit for bit, "
              f"max |typed - single-device reference| = {err:.2e}")
    return {"max_abs_err": err, "loss": float(loss_t)}


if __name__ == "__main__":
    run(verbose=True)
