"""Broken twin of `examples/data_parallel.py`: the gradients are all-reduced by hand.

The loss here is the per-device loss (Varying over dp); `jax.grad` already sums the
gradient of the Invariant parameters over dp. The hand-written `pmean` then averages 8
identical copies (JAX pvarys them silently): the "averaged" gradient is really the sum, so
the effective learning rate is 8x too large.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import spmdtyped as st
from spmdtyped import Invariant, Varying

LR = 0.1


def local_loss(w: Invariant, b: Invariant, x: Varying["dp"], y: Varying["dp"]) -> Varying["dp"]:
    err = x @ w + b - y
    return (err * err).mean()


def step(w: Invariant, b: Invariant, x: Varying["dp"],
         y: Varying["dp"]) -> tuple[Invariant, Invariant, Invariant]:
    loss, (gw, gb) = st.value_and_grad(local_loss, argnums=(0, 1))(w, b, x, y)
    gw = st.pmean(gw, "dp")  # expect: SPMD103
    gb = st.pmean(gb, "dp")
    return w - LR * gw, b - LR * gb, st.pmean(loss, "dp")


def run_broken() -> None:
    from examples import data_parallel as ok

    mesh = ok.make_mesh()
    st.shard_map(step, mesh=mesh, in_specs=ok.SPECS, out_specs=ok.OUT_SPECS)(*ok.make_inputs(mesh))


if __name__ == "__main__":
    run_broken()
