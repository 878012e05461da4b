"""Broken twin of `examples/megatron_mlp.py`: the bias is added to the partial sums.

`partial + b2` adds b2 on each of the 4 tp devices before the psum, so the result carries
4 * b2. JAX accepts the raw program; spmdtyped rejects it statically and at trace time.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import spmdtyped as st
from spmdtyped import Varying


def mlp(x: Varying["dp"], w1: Varying["tp"], b1: Varying["tp"], w2: Varying["tp"],
        b2: st.Invariant) -> Varying["dp"]:
    h = st.numpy.tanh(x @ w1 + b1)
    partial = st.pcast(h @ w2, "tp", to="unreduced")
    return st.psum(partial + b2, "tp")  # expect: SPMD201


def run_broken() -> None:
    """Trace the broken function with the good example's mesh, specs and inputs."""
    from examples import megatron_mlp as ok

    mesh = ok.make_mesh()
    st.shard_map(mlp, mesh=mesh, in_specs=ok.SPECS, out_specs=ok.OUT_SPECS)(*ok.make_inputs(mesh))


if __name__ == "__main__":
    run_broken()
