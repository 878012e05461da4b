"""Mixture of experts with all_to_all: one expert per device on the `ep` axis (8 experts).

Tokens are sharded over ep. Each device routes its tokens (top-1 gate), lays them out per
expert (a dense, masked dispatch buffer `[experts, tokens, d]`), and `all_to_all` sends block
e to device e. Every device applies its own expert to the tokens it received, a second
`all_to_all` sends the results home, and each token keeps its chosen expert's output times
the gate. The load-balancing loss averages routing fractions over ep with one `pmean`.
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

EXPERTS = 8
SPECS = (P("ep"), P(), P("ep"), P("ep"))
OUT_SPECS = (P("ep"), P())


def make_mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((EXPERTS,), ("ep",))


def moe(x: Varying["ep"], router: Invariant, w_in: Varying["ep"],
        w_out: Varying["ep"]) -> tuple[Varying["ep"], Invariant]:
    logits = x @ router                                    # [t, E]       Varying["ep"]
    probs = st.nn.softmax(logits, axis=-1)
    choice = st.numpy.argmax(probs, axis=-1)               # [t]
    mask = st.nn.one_hot(choice, EXPERTS, dtype=x.dtype)   # [t, E]
    gate = (probs * mask).sum(axis=-1)                     # [t]
    dispatch = st.numpy.einsum("te,td->etd", mask, x)      # [E, t, d]
    received = st.all_to_all(dispatch, "ep", 0, 1, tiled=True)   # [1, E*t, d]: my expert's tokens
    hidden = st.numpy.tanh(st.numpy.einsum("etd,edh->eth", received, w_in))
    expert_out = st.numpy.einsum("eth,ehd->etd", hidden, w_out)
    returned = st.all_to_all(expert_out, "ep", 1, 0, tiled=True)  # [E, t, d] back home
    y = st.numpy.einsum("etd,te->td", returned, mask) * gate[:, None]
    frac = st.pmean(mask.mean(axis=0), "ep")               # fraction of tokens per expert
    mean_prob = st.pmean(probs.mean(axis=0), "ep")
    aux = (frac * mean_prob).sum() * EXPERTS               # load-balancing loss, Invariant
    return y, aux


def moe_raw(x, router, w_in, w_out):  # type: ignore[no-untyped-def]
    logits = x @ router
    probs = jax.nn.softmax(logits, axis=-1)
    choice = jnp.argmax(probs, axis=-1)
    mask = jax.nn.one_hot(choice, EXPERTS, dtype=x.dtype)
    gate = (probs * mask).sum(axis=-1)
    dispatch = jnp.einsum("te,td->etd", mask, x)
    received = jax.lax.all_to_all(dispatch, "ep", 0, 1, tiled=True)
    hidden = jnp.tanh(jnp.einsum("etd,edh->eth", received, w_in))
    expert_out = jnp.einsum("eth,ehd->etd", hidden, w_out)
    returned = jax.lax.all_to_all(expert_out, "ep", 1, 0, tiled=True)
    y = jnp.einsum("etd,te->td", returned, mask) * gate[:, None]
    frac = jax.lax.pmean(mask.mean(axis=0), "ep")
    mean_prob = jax.lax.pmean(probs.mean(axis=0), "ep")
    return y, (frac * mean_prob).sum() * EXPERTS


def reference(x, router, w_in, w_out):  # type: ignore[no-untyped-def]
    probs = jax.nn.softmax(x @ router, axis=-1)
    choice = jnp.argmax(probs, axis=-1)
    gate = jnp.take_along_axis(probs, choice[:, None], axis=-1)[:, 0]
    out = jnp.tanh(jnp.einsum("td,tdh->th", x, w_in[choice]))
    y = jnp.einsum("th,thd->td", out, w_out[choice]) * gate[:, None]
    mask = jax.nn.one_hot(choice, EXPERTS)
    return y, (mask.mean(0) * probs.mean(0)).sum() * EXPERTS


def make_inputs(mesh: jax.sharding.Mesh, tokens: int = 64, d: int = 8, hidden: int = 16):  # type: ignore[no-untyped-def]
    ks = jax.random.split(jax.random.key(2), 4)
    arrays = (jax.random.normal(ks[0], (tokens, d)), jax.random.normal(ks[1], (d, EXPERTS)),
              jax.random.normal(ks[2], (EXPERTS, d, hidden)) / d**0.5,
              jax.random.normal(ks[3], (EXPERTS, hidden, d)) / hidden**0.5)
    return tuple(jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(arrays, SPECS, strict=False))


def programs(mesh: jax.sharding.Mesh):  # type: ignore[no-untyped-def]
    typed = jax.jit(st.shard_map(moe, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    raw = jax.jit(jax.shard_map(moe_raw, mesh=mesh, in_specs=SPECS, out_specs=OUT_SPECS))
    return typed, raw


def run(verbose: bool = False) -> dict[str, float]:
    mesh = make_mesh()
    args = make_inputs(mesh)
    typed, raw = programs(mesh)
    (y, aux), (y_raw, aux_raw) = typed(*args), raw(*args)
    assert np.array_equal(np.asarray(y), np.asarray(y_raw)) and float(aux) == float(aux_raw)
    y_ref, aux_ref = reference(*(np.asarray(a) for a in args))
    err = float(np.max(np.abs(np.asarray(y) - np.asarray(y_ref))))
    assert err < 1e-4 and abs(float(aux) - float(aux_ref)) < 1e-5, (err, float(aux), float(aux_ref))
    if verbose:
        print(f"MoE: {EXPERTS} experts, output {y.shape}, aux loss {float(aux):.4f}, "
              f"max |typed - reference| = {err:.2e}")
    return {"max_abs_err": err, "aux": float(aux)}


if __name__ == "__main__":
    run(verbose=True)
