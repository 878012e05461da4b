"""Broken twin of `examples/sequence_parallel.py`: the residual is scattered instead of the output.

After the gather, `full` is Invariant over tp; `psum_scatter` of it sums 4 identical copies
(JAX pvarys it silently), so the residual comes back multiplied by 4.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import spmdtyped as st
from spmdtyped import Varying


def block(x: Varying["dp", "tp"], w1: Varying["tp"], w2: Varying["tp"]) -> Varying["dp", "tp"]:
    full = st.all_gather(x, "tp", axis=1, tiled=True, to="invarying")
    h = st.numpy.tanh(full @ w1)
    partial = st.pcast(h @ w2, "tp", to="unreduced")
    residual = st.psum_scatter(full, "tp", scatter_dimension=1, tiled=True)  # expect: SPMD103
    return residual + st.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)


def run_broken() -> None:
    from examples import sequence_parallel as ok

    mesh = ok.make_mesh()
    st.shard_map(block, mesh=mesh, in_specs=ok.SPECS, out_specs=ok.OUT_SPECS)(*ok.make_inputs(mesh))


if __name__ == "__main__":
    run_broken()
