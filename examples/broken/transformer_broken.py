"""Broken twin of `examples/transformer.py`: the MLP activation runs before the tp reduction.

A "fused" rewrite applies `tanh` to the row-parallel partial products and psums afterwards:
tanh(sum of partials) is not the sum of tanh(partials). The partial products are declared
Unreduced, so spmdtyped rejects the non-linear op on them.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax

import spmdtyped as st
from spmdtyped import Invariant, Varying


def block(x: Varying["dp"], p: dict[str, Varying["tp"]]) -> Varying["dp"]:
    h = x @ p["w1"]
    partial = st.pcast(h @ p["w2"], "tp", to="unreduced")
    return x + st.psum(st.numpy.tanh(partial), "tp")  # expect: SPMD202


def loss_fn(params: list[dict[str, Varying["tp"]]], x: Varying["dp"], y: Varying["dp"]) -> Invariant:
    for p in params:
        x = block(x, p)
    err = x - y
    return st.pmean((err * err).mean(), "dp")


def run_broken() -> None:
    from examples import transformer as ok

    mesh = ok.make_mesh()
    in_specs, _ = ok.specs()
    fn = st.shard_map(loss_fn, mesh=mesh, in_specs=in_specs, out_specs=jax.sharding.PartitionSpec())
    fn(*ok.make_inputs(mesh))


if __name__ == "__main__":
    run_broken()
