"""Data-parallel training of a linear regression: parameters Invariant, batch Varying["dp"].

The loss is averaged over dp with `pmean`, so it is Invariant; its gradient with respect to
the Invariant parameters is Invariant too and already averaged over the devices (the
transpose of JAX's implicit pvary sums per-device contributions). No explicit gradient
all-reduce is needed — adding one is the mistake in `broken/data_parallel_broken.py`.
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
from spmdtyped import Invariant, Varying

SPECS = (P(), P(), P("dp"), P("dp"))
OUT_SPECS = (P(), P(), P())
LR = 0.1


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((8,), ("dp",))


def loss_fn(w: Invariant, b: Invariant, x: Varying["dp"], y: Varying["dp"]) -> Invariant:
    err = x @ w + b - y
    return st.pmean((err * err).mean(), "dp")


def step(w: Invariant, b: Invariant, x: Varying["dp"],
         y: Varying["dp"]) -> tuple[Invariant, Invariant, Invariant]:
    loss, (gw, gb) = st.value_and_grad(loss_fn, argnums=(0, 1))(w, b, x, y)
    return w - LR * gw, b - LR * gb, loss


def step_raw(w, b, x, y):  # type: ignore[no-untyped-def]
    def loss_raw(w, b):  # type: ignore[no-untyped-def]
        err = x @ w + b - y
        return jax.lax.pmean((err * err).mean(), "dp")

    loss, (gw, gb) = jax.value_and_grad(loss_raw, argnums=(0, 1))(w, b)
    return w - LR * gw, b - LR * gb, loss


def reference_step(w, b, x, y):  # type: ignore[no-untyped-def]
    def loss_ref(w, b):  # type: ignore[no-untyped-def]
        return jnp.mean((x @ w + b - y) ** 2)

    loss, (gw, gb) = jax.value_and_grad(loss_ref, argnums=(0, 1))(w, b)
    return w - LR * gw, b - LR * gb, loss


def make_inputs(mesh: jax.sharding.Mesh, n: int = 64, d: int = 8):  # type: ignore[no-untyped-def]
    kx, kw = jax.random.split(jax.random.key(3))
    x = jax.random.normal(kx, (n, d))
    true_w = jax.random.normal(kw, (d,))
    y = x @ true_w + 0.5
    arrays = (jnp.zeros((d,)), jnp.zeros(()), x, y)
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, SPECS, strict=False))


def programs(mesh: jax.sharding.Mesh):  # type: ignore[no-untyped-def]
    typed = jax.jit(st.shard_map(step, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    raw = jax.jit(jax.shard_map(step_raw, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    return typed, raw


def run(verbose: bool = False, steps: int = 50) -> dict[str, float]:
    mesh = make_mesh()
    w, b, x, y = make_inputs(mesh)
    typed, raw = programs(mesh)
    wr, br = w, b
    ref = (np.zeros(w.shape, np.float32), np.float32(0.0))
    first = None
    for _ in range(steps):
        w, b, loss = typed(w, b, x, y)
        wr, br, loss_raw = raw(wr, br, x, y)
        ref_w, ref_b, ref_loss = reference_step(ref[0], ref[1], np.asarray(x), np.asarray(y))
        ref = (ref_w, ref_b)
        first = float(loss) if first is None else first
        assert float(loss) == float(loss_raw)
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-4, atol=1e-6)
    assert np.array_equal(np.asarray(w), np.asarray(wr))
    np.testing.assert_allclose(np.asarray(w), np.asarray(ref[0]), rtol=1e-4, atol=1e-5)
    assert first is not None and float(loss) < first
    if verbose:
        print(f"data parallel: loss {first:.4f} -> {float(loss):.6f} in {steps} steps "
              f"(matches the single-device reference)")
    return {"first_loss": first, "last_loss": float(loss)}


if __name__ == "__main__":
    run(verbose=True)
