"""Broken twin of `examples/equinox_optax.py`: the loss is averaged over dp twice.

`loss_fn` already returns `st.pmean(..., "dp")`, an Invariant value; averaging it again in the
step makes JAX pvary the Invariant loss and "average" 2 identical copies (a silent no-op here,
a silent factor when the op is a `psum`). spmdtyped rejects an axis op on a value that is
already Invariant over that axis.
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from typing import Any

import equinox as eqx
import jax

import spmdtyped as st
from examples import equinox_optax as ok
from spmdtyped import Invariant, Varying


def step(model: ok.Transformer, opt_state: Any, tokens: Varying["dp"],
         labels: Varying["dp"]) -> tuple[ok.Transformer, Any, Invariant]:
    def loss_fn(m: ok.Transformer) -> Invariant:
        return st.pmean(ok.cross_entropy(m(tokens, "tp"), labels), "dp")

    loss, grads = st.value_and_grad(loss_fn)(model)
    loss_inv: Invariant = loss
    updates, opt_state = ok.OPT.update(grads, opt_state, model)
    mean_loss = st.pmean(loss_inv, "dp")  # expect: SPMD103
    return eqx.apply_updates(model, updates), opt_state, mean_loss


def run_broken() -> None:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    model = jax.tree.map(lambda a, s: jax.device_put(a, ok.NamedSharding(mesh, s)),
                         ok.init_model(jax.random.PRNGKey(0)), ok.model_specs())
    with jax.set_mesh(mesh):
        opt_state = jax.jit(ok.OPT.init)(model)
    tokens, labels = (jax.device_put(t, ok.NamedSharding(mesh, ok.P("dp"))) for t in ok.data(0))
    jax.jit(st.shard_map(step, mesh=mesh))(model, opt_state, tokens, labels)


if __name__ == "__main__":
    run_broken()
