"""Broken twin of `examples/zero3.py`: parameters gathered Invariant, gradients reduced twice.

`all_gather(to="invarying")` makes the full parameters Invariant, so `jax.grad` already sums the
per-device gradients over dp (the transpose of the implicit pvary is a psum). `psum_scatter`
then sums 8 identical copies again: JAX pvarys the Invariant gradient silently and every
update is 8x too large. spmdtyped rejects the second reduction.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import spmdtyped as st
from spmdtyped import Invariant, Varying


def train_step(shards: dict[str, Varying["dp"]], x: Varying["dp"],
               y: Varying["dp"]) -> tuple[dict[str, Varying["dp"]], Invariant]:
    from examples import zero3 as ok

    full = {k: st.all_gather(s, "dp", tiled=True, to="invarying") for k, s in shards.items()}
    loss, grads = st.value_and_grad(ok.loss_fn)(full, x, y)                 # Invariant grads
    g_shards = {k: st.psum_scatter(v, "dp", tiled=True) for k, v in grads.items()}  # expect: SPMD103
    new = {k: shards[k] - ok.LR * g_shards[k] for k in shards}
    return new, st.pmean(loss, "dp")


def run_broken() -> None:
    from jax.sharding import PartitionSpec as P

    from examples import zero3 as ok

    mesh = ok.make_mesh()
    st.shard_map(train_step, mesh=mesh, in_specs=(ok.PARAM_SPECS, ok.DATA_SPEC, ok.DATA_SPEC),
                 out_specs=(ok.PARAM_SPECS, P()))(*ok.make_inputs(mesh))


if __name__ == "__main__":
    run_broken()
