"""The Llama-style decoder of tests/_llama.py as a flax nnx module (jnp / jax.nn / jax.lax
inside, typed hints only at the `st.shard_map` step, optax.adamw), under `nnx.value_and_grad`
and `jax.value_and_grad` (issue 27): the three mistakes are each caught by st.shard_map at the
mistake's line with the right fix, and the correct model trains equal to a single-device run.
The same step with no spmdtyped in it under `st.adapters.checking(step)` and the drop-in
`typed_shard_map`: the same codes at the same lines, the same numbers as JAX."""

from __future__ import annotations

from typing import Any

import _llama as L
import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

NAMES = [("embed", None), ("g_out", None)] + [
    (f"b{i}_{k}", k) for i in range(L.LAYERS) for k in L.block_specs(P)]


class Decoder(nnx.Module):
    def __init__(self, tree):
        self.embed = nnx.Param(tree["embed"])
        self.g_out = nnx.Param(tree["g_out"])
        for i, b in enumerate(tree["blocks"]):
            for k, v in b.items():
                setattr(self, f"b{i}_{k}", nnx.Param(v))

    def __call__(self, tokens):
        tree = {"embed": self.embed[...], "g_out": self.g_out[...],
                "blocks": [{k: getattr(self, f"b{i}_{k}")[...] for k in L.block_specs(P)}
                           for i in range(L.LAYERS)]}
        return L.decoder(tree, tokens)


mesh = jax.make_mesh((2, 4), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
OPT = optax.adamw(1e-2)
BLOCK_SPECS = L.block_specs(P)


def spec_of(path, _leaf):
    name = str(path[0].key if hasattr(path[0], "key") else path[0])
    kind = name.split("_", 1)[1] if name.startswith("b") and "_" in name else None
    return BLOCK_SPECS.get(kind, P()) if kind else P()


def put(tree, specs):
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)


def make_step(graphdef, grad: str, mistake: str | None, specs, sspecs):
    @jax.jit
    @st.shard_map(mesh=mesh, in_specs=(specs, sspecs, P("dp"), P("dp")),
                  out_specs=(specs, sspecs, P()))
    def step(params: Any, state: Any, x: Varying["dp"], y: Varying["dp"]):
        def loss_fn(m):
            return jax.lax.pmean(L.loss_of(m(x), y), "dp")

        model = nnx.merge(graphdef, params)
        if grad == "nnx":
            loss, grads = nnx.value_and_grad(loss_fn)(model)
        else:
            loss, grads = jax.value_and_grad(lambda p: loss_fn(nnx.merge(graphdef, p)))(params)
        if mistake == "pmean_reduced_grads":
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)  # MISTAKE: pmean_reduced_grads
        updates, state = OPT.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    return step


PMEAN_LINE = L.line_in(__file__, "pmean_reduced_grads")


@pytest.fixture(autouse=True)
def _tp():
    with L.tensor_parallel():
        yield


def _setup(grad, mistake, build=None):
    graphdef, params = nnx.split(Decoder(L.init_params()), nnx.Param)
    specs = jax.tree_util.tree_map_with_path(spec_of, params)
    params = put(params, specs)
    state = OPT.init(params)
    sspecs = optax.tree_map_params(OPT, lambda _p, s: s, state, specs,
                                   transform_non_params=lambda _: P(),
                                   is_leaf=lambda x: isinstance(x, P))
    x, y = L.batch()
    return ((build or make_step)(graphdef, grad, mistake, specs, sspecs),
            (params, state, put(x, P("dp")), put(y, P("dp"))))


MISTAKES = {
    "bias_before_psum": ("SPMD210", lambda: L.mistake_line("bias_before_psum"), "st.psum(x, 'tp') + b"),
    "no_psum": ("SPMD210", lambda: L.mistake_line("no_psum"), "st.psum(x, 'tp') + b"),
    "pmean_reduced_grads": ("SPMD103", lambda: PMEAN_LINE, "drop the jax.lax.pmean"),
}


@pytest.mark.parametrize("grad", ["nnx", "jax"])
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_mistake_caught_at_its_line(mistake, grad):
    code, line, fix = MISTAKES[mistake]
    L.CONFIG["MISTAKE"] = None if mistake == "pmean_reduced_grads" else mistake
    step, args = _setup(grad, mistake)
    L.assert_mistake(lambda: step(*args), code, line(), fix)


@pytest.mark.parametrize("grad", ["nnx", "jax"])
def test_correct_model_trains_equal_to_one_device(grad):
    step, (params, state, x, y) = _setup(grad, None)
    losses = []
    for _ in range(2):
        params, state, loss = step(params, state, x, y)
        losses.append(float(loss))
    L.CONFIG.update(TP=None)
    ref = L.init_params()
    ref_state = OPT.init(ref)
    rx, ry = L.batch()
    want = []
    for _ in range(2):
        loss, g = jax.value_and_grad(lambda p: L.loss_of(L.decoder(p, rx), ry))(ref)
        updates, ref_state = OPT.update(g, ref_state, ref)
        ref = optax.apply_updates(ref, updates)
        want.append(float(loss))
    np.testing.assert_allclose(losses, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(params["embed"][...]), np.asarray(ref["embed"]),
                               rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------------------------------------
# The same model and step with no spmdtyped in them (`nnx.value_and_grad`), under
# `st.adapters.checking(step)` and the drop-in `st.adapters.typed_shard_map`: each mistake at the
# same line with the same code as in st.shard_map (one engine).

def make_raw_step(graphdef, face: str, mistake: str | None, specs, sspecs):
    def step(params, state, x, y):
        def loss_fn(m):
            return jax.lax.pmean(L.loss_of(m(x), y), "dp")

        loss, grads = nnx.value_and_grad(loss_fn)(nnx.merge(graphdef, params))
        if mistake == "pmean_reduced_grads":
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)  # MISTAKE: raw_pmean
        updates, state = OPT.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    shard_map = st.adapters.typed_shard_map if face == "typed_shard_map" else jax.shard_map
    program = jax.jit(shard_map(step, mesh=mesh, in_specs=(specs, sspecs, P("dp"), P("dp")),
                                out_specs=(specs, sspecs, P())))
    return st.adapters.checking(program) if face == "checking" else program


RAW_PMEAN_LINE = L.line_in(__file__, "raw_pmean")


@pytest.mark.parametrize("face", ["checking", "typed_shard_map"])
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_raw_step_mistake_caught_at_its_line(mistake, face):
    code, line, fix = MISTAKES[mistake]
    if mistake == "pmean_reduced_grads":
        line = lambda: RAW_PMEAN_LINE  # noqa: E731
    L.CONFIG["MISTAKE"] = None if mistake == "pmean_reduced_grads" else mistake
    step, args = _setup(face, mistake, build=make_raw_step)
    L.assert_mistake(lambda: step(*args), code, line(), fix)


def test_raw_correct_step_under_checking_runs_as_jax_shard_map():
    step, (params, state, x, y) = _setup("checking", None, build=make_raw_step)
    raw, _ = _setup("jax", None, build=make_raw_step)
    got = want = (params, state)
    for _ in range(2):
        *got, loss_got = step(*got, x, y)
        *want, loss_want = raw(*want, x, y)
        np.testing.assert_array_equal(np.asarray(loss_got), np.asarray(loss_want))
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))
