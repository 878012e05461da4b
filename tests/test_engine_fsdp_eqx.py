"""A 3-axis (dp, fsdp, tp) step as people write it: an equinox MLP whose weights are sharded
over fsdp and gathered inside the module (`jax.lax.all_gather(..., tiled=True)`), its second
projection row-parallel over tp (`jax.lax.psum`), the batch over (dp, fsdp), jnp / jax.nn
inside, `eqx.filter_value_and_grad`, a `jax.tree.map` lambda over the gradients. Run by
`st.shard_map` (hints at the step only), `st.adapters.typed_shard_map` and
`st.adapters.checking()` around the unchanged `jax.shard_map`:

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
    with open(__file__) as f:
        return next(n for n, text in enumerate(f, 1) if text.rstrip().endswith(marker))


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
