"""Broken twin of `examples/collective_matmul.py`: the ring is fed the gathered input.

A half-finished refactor keeps the old `all_gather` in front of the ring: the block is now
Invariant over tp, so the ring passes identical copies around (JAX pvarys them silently)
and every "step" multiplies the whole gathered matrix again. spmdtyped rejects the
ppermute of a value that is already Invariant on the ring's axis.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import spmdtyped as st
from spmdtyped import Varying

N = 8
RING = [(j, (j - 1) % N) for j in range(N)]


def matmul(x: Varying["tp"], w: Varying["tp"]) -> Varying["tp"]:
    block = st.all_gather(x, "tp", tiled=True, to="invarying")
    passed = st.ppermute(block, "tp", RING)  # expect: SPMD103
    return passed @ w


def run_broken() -> None:
    from examples import collective_matmul as ok

    mesh = ok.make_mesh()
    st.shard_map(matmul, mesh=mesh, in_specs=ok.SPECS, out_specs=ok.OUT_SPECS)(*ok.make_inputs(mesh))


if __name__ == "__main__":
    run_broken()
