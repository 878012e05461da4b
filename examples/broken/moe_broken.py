"""Broken twin of `examples/moe.py`: the load-balancing loss is averaged over ep twice.

`frac` and `mean_prob` are already Invariant after their pmeans; the extra `pmean` of their
product is silently accepted by JAX (it pvarys, then averages identical copies) and hides a
wrong belief about where the reduction happens.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import spmdtyped as st
from spmdtyped import Invariant, Varying

EXPERTS = 8


def moe(x: Varying["ep"], router: Invariant, w_in: Varying["ep"],
        w_out: Varying["ep"]) -> tuple[Varying["ep"], Invariant]:
    logits = x @ router
    probs = st.nn.softmax(logits, axis=-1)
    choice = st.numpy.argmax(probs, axis=-1)
    mask = st.nn.one_hot(choice, EXPERTS, dtype=x.dtype)
    gate = (probs * mask).sum(axis=-1)
    dispatch = st.numpy.einsum("te,td->etd", mask, x)
    received = st.all_to_all(dispatch, "ep", 0, 1, tiled=True)
    hidden = st.numpy.tanh(st.numpy.einsum("etd,edh->eth", received, w_in))
    expert_out = st.numpy.einsum("eth,ehd->etd", hidden, w_out)
    returned = st.all_to_all(expert_out, "ep", 1, 0, tiled=True)
    y = st.numpy.einsum("etd,te->td", returned, mask) * gate[:, None]
    frac = st.pmean(mask.mean(axis=0), "ep")
    mean_prob = st.pmean(probs.mean(axis=0), "ep")
    aux = st.pmean((frac * mean_prob).sum(), "ep") * EXPERTS  # expect: SPMD103
    return y, aux


def run_broken() -> None:
    from examples import moe as ok

    mesh = ok.make_mesh()
    st.shard_map(moe, mesh=mesh, in_specs=ok.SPECS, out_specs=ok.OUT_SPECS)(*ok.make_inputs(mesh))


if __name__ == "__main__":
    run_broken()
