"""Broken twin of `examples/ring_attention.py`: the log-sum-exp output's spec forgets `sp`.

Ring attention also returns the log-sum-exp of every query row (the backward pass needs it).
It is Varying over `sp` like the queries, but its out_spec only names `dp`: one device's shard
would silently stand for the whole sequence. spmdtyped rejects the spec at the boundary.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import spmdtyped as st
import spmdtyped.numpy as snp
from spmdtyped import Varying


def ring_attention_lse(q: Varying["dp", "sp"], k: Varying["dp", "sp"],
                       v: Varying["dp", "sp"]) -> tuple[Varying["dp", "sp"], Varying["dp", "sp"]]:
    from examples import ring_attention as ok

    out = ok.ring_attention(q, k, v)
    scores = snp.einsum("bqd,bkd->bqk", q, k) / q.shape[-1] ** 0.5
    return out, snn_logsumexp(scores)


def snn_logsumexp(s: Varying["dp", "sp"]) -> Varying["dp", "sp"]:
    return st.nn.logsumexp(s, axis=-1)


def run_broken() -> None:
    from jax.sharding import PartitionSpec as P

    from examples import ring_attention as ok

    mesh = ok.make_mesh()
    f = st.shard_map(ring_attention_lse, mesh=mesh, in_specs=(ok.SPEC,) * 3,
                     out_specs=(ok.SPEC, P("dp")))
    f(*ok.make_inputs(mesh))  # expect: SPMD401


if __name__ == "__main__":
    run_broken()
