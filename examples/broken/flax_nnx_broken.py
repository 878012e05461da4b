"""Broken twin of `examples/flax_nnx.py`: the loss is averaged over dp twice.

`loss_fn` already returns `st.pmean(..., "dp")`, an Invariant value; averaging it again in the
step is an axis op on a value that is already Invariant over that axis (JAX would pvary it
silently).
"""

from __future__ import annotations

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

from typing import Any

import jax
import optax  # type: ignore[import-untyped]
from flax import nnx

import spmdtyped as st
from examples import flax_nnx as ok
from spmdtyped import Invariant, Varying


def make_step(graphdef: Any) -> Any:
    def step(params: nnx.State, opt_state: Any, tokens: Varying["dp"],
             labels: Varying["dp"]) -> tuple[nnx.State, Any, Invariant]:
        def loss_fn(p: nnx.State) -> Invariant:
            return st.pmean(ok.cross_entropy(nnx.merge(graphdef, p)(tokens, "tp"), labels), "dp")

        loss, grads = st.value_and_grad(loss_fn)(params)
        loss_inv: Invariant = loss
        updates, opt_state = ok.OPT.update(grads, opt_state, params)
        mean_loss = st.pmean(loss_inv, "dp")  # expect: SPMD103
        return optax.apply_updates(params, updates), opt_state, mean_loss

    return step


def run_broken() -> None:
    mesh = jax.make_mesh((2, 4), ("dp", "tp"))
    graphdef, params0 = nnx.split(ok.Transformer(nnx.Rngs(0)), nnx.Param)
    params = jax.tree.map(lambda a, s: jax.device_put(a, ok.NamedSharding(mesh, s)), params0,
                          ok.param_specs(params0))
    with jax.set_mesh(mesh):
        opt_state = jax.jit(ok.OPT.init)(params)
    tokens, labels = (jax.device_put(t, ok.NamedSharding(mesh, ok.P("dp"))) for t in ok.data(0))
    jax.jit(st.shard_map(make_step(graphdef), mesh=mesh))(params, opt_state, tokens, labels)


if __name__ == "__main__":
    run_broken()
