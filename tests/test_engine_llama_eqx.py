"""A Llama-style decoder in equinox, written as docs/ecosystem.md teaches (jnp / jax.nn /
jax.lax inside the modules, typed hints only at the `st.shard_map` step, optax.adamw), under
`eqx.filter_value_and_grad` and `jax.value_and_grad` (issue 27): the three mistakes of
tests/_llama.py are each caught by st.shard_map at the mistake's line with the right fix, and
the correct model trains equal to a single-device run. The same step with no spmdtyped in it
(`jax.shard_map`, `eqx.filter_value_and_grad`) under `st.adapters.checking(step)` and the
drop-in `typed_shard_map`: the same codes at the same lines, the same numbers as JAX."""

from __future__ import annotations

from typing import Any

import _llama as L
import equinox as eqx
import jax
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

BLOCK_FIELDS = tuple(L.block_specs(P))


class Block(eqx.Module):
    g1: Any
    g2: Any
    wq: Any
    wk: Any
    wv: Any
    wo: Any
    w_gate: Any
    w_up: Any
    w_down: Any
    b_down: Any

    def __call__(self, x):
        return L.block({f: getattr(self, f) for f in BLOCK_FIELDS}, x)


class Decoder(eqx.Module):
    embed: Any
    blocks: list
    g_out: Any

    def __call__(self, tokens):
        return L.decoder({"embed": self.embed, "blocks": [vars_of(b) for b in self.blocks],
                          "g_out": self.g_out}, tokens)


def vars_of(b):
    return {f: getattr(b, f) for f in BLOCK_FIELDS}


def as_decoder(tree) -> Decoder:
    return Decoder(tree["embed"], [Block(**b) for b in tree["blocks"]], tree["g_out"])


mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
OPT = optax.adamw(1e-2)
SPECS = as_decoder(L.param_specs(P))


def put(tree, specs):
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)


def state_specs(state):
    return optax.tree_map_params(OPT, lambda _p, s: s, state, SPECS,
                                 transform_non_params=lambda _: P(),
                                 is_leaf=lambda x: isinstance(x, P))


def make_step(grad: str, mistake: str | None, sspecs):
    @jax.jit
    @st.shard_map(mesh=mesh, in_specs=(SPECS, sspecs, P("dp"), P("dp")),
                  out_specs=(SPECS, sspecs, P()))
    def step(model: Decoder, state: Any, x: Varying["dp"], y: Varying["dp"]):
        def loss_fn(m):
            return jax.lax.pmean(L.loss_of(m(x), y), "dp")

        if grad == "eqx":
            loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        else:
            loss, grads = jax.value_and_grad(loss_fn)(model)
        if mistake == "pmean_reduced_grads":
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)  # MISTAKE: pmean_reduced_grads
        updates, state = OPT.update(grads, state, model)
        return eqx.apply_updates(model, updates), state, loss

    return step


PMEAN_LINE = L.line_in(__file__, "pmean_reduced_grads")


@pytest.fixture(autouse=True)
def _tp():
    with L.tensor_parallel():
        yield


def inputs():
    model = put(as_decoder(L.init_params()), SPECS)
    state = OPT.init(model)
    x, y = L.batch()
    return model, state, put(x, P("dp")), put(y, P("dp"))


MISTAKES = {
    "bias_before_psum": ("SPMD210", lambda: L.mistake_line("bias_before_psum"), "st.psum(x, 'tp') + b"),
    "no_psum": ("SPMD210", lambda: L.mistake_line("no_psum"), "st.psum(x, 'tp') + b"),
    "pmean_reduced_grads": ("SPMD103", lambda: PMEAN_LINE, "drop the jax.lax.pmean"),
}


@pytest.mark.parametrize("grad", ["eqx", "jax"])
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_mistake_caught_at_its_line(mistake, grad):
    code, line, fix = MISTAKES[mistake]
    L.CONFIG["MISTAKE"] = None if mistake == "pmean_reduced_grads" else mistake
    model, state, x, y = inputs()
    step = make_step(grad, mistake, state_specs(state))
    e = L.assert_mistake(lambda: step(model, state, x, y), code, line(), fix)
    assert e.file.endswith(("_llama.py", "test_engine_llama_eqx.py"))


def _reference_run(steps):
    L.CONFIG.update(TP=None)
    params = L.init_params()
    state = OPT.init(params)
    x, y = L.batch()
    losses = []
    for _ in range(steps):
        loss, g = jax.value_and_grad(lambda p: L.loss_of(L.decoder(p, x), y))(params)
        updates, state = OPT.update(g, state, params)
        params = optax.apply_updates(params, updates)
        losses.append(float(loss))
    L.CONFIG.update(TP="tp")
    return losses, params


@pytest.mark.parametrize("grad", ["eqx", "jax"])
def test_correct_model_trains_equal_to_one_device(grad):
    model, state, x, y = inputs()
    step = make_step(grad, None, state_specs(state))
    losses = []
    for _ in range(2):
        model, state, loss = step(model, state, x, y)
        losses.append(float(loss))
    want_losses, want = _reference_run(2)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5, atol=1e-5)
    got = {"embed": model.embed, "blocks": [vars_of(b) for b in model.blocks],
           "g_out": model.g_out}
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The same model and step with no spmdtyped in them: `jax.shard_map` checked by
# `st.adapters.checking(step)` (nothing edited) and `st.adapters.typed_shard_map` (the drop-in).
# One engine: each mistake is caught at the same line with the same code as in st.shard_map.

def raw_body(mistake: str | None):
    def step(model, state, x, y):
        def loss_fn(m):
            return jax.lax.pmean(L.loss_of(m(x), y), "dp")

        loss, grads = eqx.filter_value_and_grad(loss_fn)(model)
        if mistake == "pmean_reduced_grads":
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)  # MISTAKE: raw_pmean
        updates, state = OPT.update(grads, state, model)
        return eqx.apply_updates(model, updates), state, loss

    return step


def make_raw_step(face: str, mistake: str | None, sspecs):
    shard_map = {"checking": jax.shard_map, "typed_shard_map": st.adapters.typed_shard_map,
                 "jax": jax.shard_map}[face]
    program = jax.jit(shard_map(raw_body(mistake), mesh=mesh,
                                in_specs=(SPECS, sspecs, P("dp"), P("dp")),
                                out_specs=(SPECS, sspecs, P())))
    return st.adapters.checking(program) if face == "checking" else program


RAW_PMEAN_LINE = L.line_in(__file__, "raw_pmean")


@pytest.mark.parametrize("face", ["checking", "typed_shard_map"])
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_raw_step_mistake_caught_at_its_line(mistake, face):
    code, line, fix = MISTAKES[mistake]
    if mistake == "pmean_reduced_grads":
        line = lambda: RAW_PMEAN_LINE  # noqa: E731
    L.CONFIG["MISTAKE"] = None if mistake == "pmean_reduced_grads" else mistake
    model, state, x, y = inputs()
    step = make_raw_step(face, mistake, state_specs(state))
    L.assert_mistake(lambda: step(model, state, x, y), code, line(), fix)


@pytest.mark.parametrize("face", ["checking", "typed_shard_map"])
def test_raw_correct_step_trains_as_jax_shard_map(face):
    model, state, x, y = inputs()
    sspecs = state_specs(state)
    checked, raw = make_raw_step(face, None, sspecs), make_raw_step("jax", None, sspecs)
    got = want = (model, state)
    for _ in range(2):
        *got, loss_got = checked(*got, x, y)
        *want, loss_want = raw(*want, x, y)
        np.testing.assert_array_equal(np.asarray(loss_got), np.asarray(loss_want))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
