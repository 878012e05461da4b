"""A 3-axis (dp, fsdp, tp) step as people write it: an equinox MLP whose weights are sharded
over fsdp and gathered inside the module (`jax.lax.all_gather(..., tiled=True)`), its second
projection row-parallel over tp (`jax.lax.psum`), the batch over (dp, fsdp), jnp / jax.nn
inside, `eqx.filter_value_and_grad`, a `jax.tree.map` lambda over the gradients. Run by
`st.shard_map` (hints at the step only), `st.adapters.typed_shard_map` and
`st.adapters.checking()` around the unchanged `jax.shard_map`; and the same step as a flax nnx
module built in the step (`nnx.Param`s read with `[...]`, `nnx.value_and_grad`):

- the correct step's loss and gradients equal one device's (and the raw program's);
- the bias added before the tp psum is SPMD210 at the module's line; raw JAX runs it with a
  wrong loss (against one device); the psum left out is SPMD210 where the bias meets the
  partial sums, with the fix "reduce first";
- a pmean over dp of gradients already reduced there is SPMD103 at the lambda's line (JAX runs
  it: the copies are identical, the collective redundant).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import line_ending_with
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

eqx = pytest.importorskip("equinox")

BATCH = P(("dp", "fsdp"))
#: mistake -> its code and a fragment of its fix
MISTAKES = {"bias_before_psum": ("SPMD210", "reduce first, then add the replicated term"),
            "pmean_reduced_grads": ("SPMD103", "drop the jax.lax.pmean"),
            # (the psum left out: the bias meets the partial sums on the projection's line)
            "psum_forgotten": ("SPMD210", "reduce first, then add the replicated term")}
MARKERS = {"bias_before_psum": "# the bias's line", "pmean_reduced_grads": "# the lambda's line",
           "psum_forgotten": "# the projection's line"}


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 2, 2), ("dp", "fsdp", "tp"))


class MLP(eqx.Module):
    w1: jax.Array
    w2: jax.Array
    b2: jax.Array
    bias_before_psum: bool = eqx.field(static=True, default=False)

    def __call__(self, x, psum=lambda v: jax.lax.psum(v, "tp"),
                 gather=lambda w, axis: jax.lax.all_gather(w, "fsdp", axis=axis, tiled=True)):
        h = jax.nn.gelu(x @ gather(self.w1, 0))
        if self.bias_before_psum:
            return psum(h @ gather(self.w2, 1) + self.b2)  # the bias's line
        return psum(h @ gather(self.w2, 1)) + self.b2  # the projection's line


def _specs(bias_before_psum=False):
    return MLP(P("fsdp", "tp"), P("tp", "fsdp"), P(), bias_before_psum)


def _inputs(bias_before_psum=False):
    k = jax.random.split(jax.random.key(40), 4)
    model = MLP(jax.random.normal(k[0], (8, 16)) / 3, jax.random.normal(k[1], (16, 8)) / 4,
                jnp.linspace(-0.5, 0.5, 8), bias_before_psum)
    return model, jax.random.normal(k[2], (16, 8)), jax.random.normal(k[3], (16, 8))


def _single_device(model, x, y):
    one = lambda v, *_: v  # noqa: E731 - no collective on one device
    return eqx.filter_value_and_grad(
        lambda m: jnp.mean((m(x, psum=one, gather=one) - y) ** 2))(model)


def _body(mistake):
    def step(m, x, y):
        forward = (lambda m: m(x, psum=lambda v: v)) if mistake == "psum_forgotten" else \
            (lambda m: m(x))
        loss, grads = eqx.filter_value_and_grad(
            lambda m: jax.lax.pmean(jnp.mean((forward(m) - y) ** 2), ("dp", "fsdp")))(m)
        if mistake == "pmean_reduced_grads":
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)  # the lambda's line
        return loss, grads
    return step


def _step(face, mistake, mesh):
    specs = _specs(mistake == "bias_before_psum")
    if face == "st.shard_map":
        body = _body(mistake)

        def hinted(m, x: Varying["dp", "fsdp"], y: Varying["dp", "fsdp"]):
            return body(m, x, y)

        smap = st.shard_map
        fn = hinted
    else:
        smap = {"typed_shard_map": st.adapters.typed_shard_map, "checking": jax.shard_map,
                "jax": jax.shard_map}[face]
        fn = _body(mistake)
    program = jax.jit(functools.partial(smap, mesh=mesh, in_specs=(specs, BATCH, BATCH),
                                        out_specs=(P(), specs))(fn))
    return st.adapters.checking(program) if face == "checking" else program


def _placed(mesh, model, x, y):
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    return jax.tree.map(put, model, _specs(model.bias_before_psum)), put(x, BATCH), put(y, BATCH)


def _line(marker):
    return line_ending_with(__file__, marker)


FACES = ["st.shard_map", "typed_shard_map", "checking"]


@pytest.mark.parametrize("face", [*FACES, "jax"])
def test_correct_step_equals_one_device(face, mesh):
    model, x, y = _inputs()
    loss, grads = _step(face, None, mesh)(*_placed(mesh, model, x, y))
    ref_loss, ref_grads = _single_device(model, x, y)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_mistake_caught_at_its_line(mistake, face, mesh):
    model, x, y = _inputs(bias_before_psum=mistake == "bias_before_psum")
    with pytest.raises(st.SpmdTypeError) as e:
        _step(face, mistake, mesh)(*_placed(mesh, model, x, y))
    marker = MARKERS[mistake]
    code, fix = MISTAKES[mistake]
    assert e.value.code == code and fix in str(e.value), str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line(marker)), str(e.value)


def test_the_bias_bug_is_real_and_the_pmean_redundant(mesh):
    """Raw JAX runs both mistakes: the bias added before the psum is summed over tp (a wrong
    loss against one device); the extra pmean leaves the numbers as they were."""
    model, x, y = _inputs(bias_before_psum=True)
    loss, _ = _step("jax", "bias_before_psum", mesh)(*_placed(mesh, model, x, y))
    ref_loss, _ = _single_device(model, x, y)
    assert not np.isclose(float(loss), float(ref_loss), rtol=1e-3)

    model, x, y = _inputs()
    loss, grads = _step("jax", "pmean_reduced_grads", mesh)(*_placed(mesh, model, x, y))
    ref_loss, ref_grads = _single_device(model, x, y)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ the same step in flax nnx

def _nnx_step(face, mistake, mesh):
    """The MLP as a flax nnx module built in the step from its sharded weights (`nnx.Param`s
    read with `[...]`), differentiated with `nnx.value_and_grad`."""
    from flax import nnx

    class NnxMLP(nnx.Module):
        def __init__(self, w1, w2, b2):
            self.w1, self.w2, self.b2 = nnx.Param(w1), nnx.Param(w2), nnx.Param(b2)

        def __call__(self, x):
            w1 = jax.lax.all_gather(self.w1[...], "fsdp", axis=0, tiled=True)
            w2 = jax.lax.all_gather(self.w2[...], "fsdp", axis=1, tiled=True)
            h = jax.nn.gelu(x @ w1)
            if mistake == "bias_before_psum":
                return jax.lax.psum(h @ w2 + self.b2[...], "tp")  # the nnx bias's line
            return jax.lax.psum(h @ w2, "tp") + self.b2[...]

    def body(w1, w2, b2, x, y):
        loss, grads = nnx.value_and_grad(
            lambda m: jax.lax.pmean(jnp.mean((m(x) - y) ** 2), ("dp", "fsdp")))(NnxMLP(w1, w2, b2))
        grads = (grads["w1"][...], grads["w2"][...], grads["b2"][...])
        if mistake == "pmean_reduced_grads":
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)  # the nnx lambda's line
        return loss, grads

    specs = (P("fsdp", "tp"), P("tp", "fsdp"), P())
    if face == "st.shard_map":
        def fn(w1, w2, b2, x: Varying["dp", "fsdp"], y: Varying["dp", "fsdp"]):
            return body(w1, w2, b2, x, y)
        smap = st.shard_map
    else:
        fn = body
        smap = {"typed_shard_map": st.adapters.typed_shard_map, "checking": jax.shard_map,
                "jax": jax.shard_map}[face]
    program = jax.jit(functools.partial(smap, mesh=mesh, in_specs=(*specs, BATCH, BATCH),
                                        out_specs=(P(), specs))(fn))
    return st.adapters.checking(program) if face == "checking" else program


NNX_MARKERS = {"bias_before_psum": "# the nnx bias's line",
               "pmean_reduced_grads": "# the nnx lambda's line"}


def _nnx_args(mesh, model, x, y):
    placed, xs, ys = _placed(mesh, model, x, y)
    return placed.w1, placed.w2, placed.b2, xs, ys


@pytest.mark.parametrize("face", [*FACES, "jax"])
def test_nnx_correct_step_equals_one_device(face, mesh):
    pytest.importorskip("flax")
    model, x, y = _inputs()
    loss, grads = _nnx_step(face, None, mesh)(*_nnx_args(mesh, model, x, y))
    ref_loss, ref_grads = _single_device(model, x, y)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(grads, (ref_grads.w1, ref_grads.w2, ref_grads.b2), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("mistake", sorted(NNX_MARKERS))
def test_nnx_mistake_caught_at_its_line(mistake, face, mesh):
    pytest.importorskip("flax")
    model, x, y = _inputs()
    with pytest.raises(st.SpmdTypeError) as e:
        _nnx_step(face, mistake, mesh)(*_nnx_args(mesh, model, x, y))
    code, fix = MISTAKES[mistake]
    assert e.value.code == code and fix in str(e.value), str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line(NNX_MARKERS[mistake])), str(e.value)
