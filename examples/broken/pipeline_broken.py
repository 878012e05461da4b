"""Broken twin of `examples/pipeline.py`: the outputs are summed over pp twice.

A helper that "collects the last stage's outputs" already psums over pp, and the caller
psums again: JAX accepts it and multiplies the result by 4 (it pvarys the Invariant value).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import spmdtyped as st
from spmdtyped import Varying

STAGES = 4


def collect(outputs: Varying["dp", "pp"]) -> Varying["dp"]:
    stage = st.axis_index("pp")
    return st.psum(st.numpy.where(stage == STAGES - 1, outputs, 0.0), "pp")


def pipeline(x: Varying["dp"], w: Varying["pp"]) -> Varying["dp"]:
    h = st.numpy.tanh(x @ w[0])
    return st.psum(collect(h), "pp")  # expect: SPMD103


def run_broken() -> None:
    from examples import pipeline as ok

    mesh = ok.make_mesh()
    st.shard_map(pipeline, mesh=mesh, in_specs=ok.SPECS, out_specs=ok.OUT_SPECS)(*ok.make_inputs(mesh))


if __name__ == "__main__":
    run_broken()
