"""A tensor-parallel decoder block in flax linen, as production code writes it (MaxText style):
`nn.RMSNorm`, `nn.DenseGeneral` heads sharded over tp, `nn.dot_product_attention` with
`nn.make_causal_mask`, a row-parallel output projection followed by `jax.lax.psum`, an MLP
with `nn.Dense` / `nn.gelu`; `module.apply(params, x)` inside the shard_map body,
`jax.value_and_grad` over the params dict, a `jax.tree.map` lambda over the gradients. Once as
one block, once as a stack of blocks under `nn.scan(nn.remat(...))` (the params get a leading
layer axis). Run by `st.shard_map` (hints at the step only), `typed_shard_map`, `checking()`
around the unchanged `jax.shard_map`, and raw JAX:

- the correct step's loss and every gradient equal one device's;
- `nn.DenseGeneral(use_bias=True)` as the row-parallel projection adds its bias to the partial
  sums before the psum: SPMD210 at the model's line that calls the layer (flax's own line
  beside it); raw JAX runs it with a wrong loss against one device;
- the psum left out: SPMD210 where the residual meets the partial sums; inside `nn.scan` the
  carry changes state first (JAX rejects the scan), SPMD302 at the model's `nn.scan` call, with
  the psum in its fix (not only the cast that would hide the bug);
- a pmean over dp of gradients already reduced there: SPMD103 at the lambda's line.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import line_ending_with, on_face
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

nn = pytest.importorskip("flax.linen")

D, HEAD, HEADS, F, LAYERS = 16, 4, 4, 32, 3
FACES = ["st.shard_map", "typed_shard_map", "checking"]


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "tp"))


class Block(nn.Module):
    """Attention heads and MLP columns split over tp (`tp=1`: one device, no collective)."""

    tp: int
    row_bias: bool = False   # the mistake: the row-parallel projection with its bias
    psum: bool = True        # False: the mistake of the psum left out

    @nn.compact
    def __call__(self, x):
        reduce = (lambda v: jax.lax.psum(v, "tp")) if self.tp > 1 else (lambda v: v)
        h = nn.RMSNorm()(x)
        q, k, v = (nn.DenseGeneral((HEADS // self.tp, HEAD), use_bias=False, name=n)(h)
                   for n in ("q", "k", "v"))
        a = nn.dot_product_attention(q, k, v, mask=nn.make_causal_mask(jnp.ones(x.shape[:2])))
        o = nn.DenseGeneral(D, axis=(-2, -1), use_bias=self.row_bias, name="o")(a)  # the o line
        x = x + (reduce(o) if self.psum else o)  # the residual's line
        u = nn.gelu(nn.Dense(F // self.tp, name="up")(nn.RMSNorm()(x)))
        return x + reduce(nn.Dense(D, use_bias=False, name="down")(u))


class Layer(nn.Module):
    """A `Block` as `nn.scan`'s body: `(carry, x) -> (carry, y)`."""

    tp: int
    row_bias: bool = False
    psum: bool = True

    @nn.compact
    def __call__(self, c, _):
        return Block(self.tp, self.row_bias, self.psum)(c), None


class Stack(nn.Module):
    """`LAYERS` blocks scanned over, each rematerialized (MaxText's `scan_layers`)."""

    tp: int
    row_bias: bool = False
    psum: bool = True

    @nn.compact
    def __call__(self, x):
        layers = nn.scan(nn.remat(Layer), variable_axes={"params": 0},
                         split_rngs={"params": True}, length=LAYERS)
        y, _ = layers(self.tp, self.row_bias, self.psum, name="layers")(x, None)  # the scan's line
        return y


MODELS = {"block": Block, "stack": Stack}


def _specs(params, stacked):
    """Heads and MLP columns over tp; a stacked model's leaves have the layer axis first."""
    def spec(path, _leaf):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        parts: tuple = ()
        if any(f"/{n}/" in name for n in ("q", "k", "v")):
            parts = (None, "tp", None)
        elif "/o/kernel" in name:
            parts = ("tp", None, None)
        elif "/up/kernel" in name:
            parts = (None, "tp")
        elif "/up/bias" in name:
            parts = ("tp",)
        elif "/down/kernel" in name:
            parts = ("tp", None)
        return P(*((None,) if stacked and parts else ()), *parts)
    return jax.tree_util.tree_map_with_path(spec, params)


def _data():
    k = jax.random.split(jax.random.key(7), 2)
    return jax.random.normal(k[0], (4, 6, D)), jax.random.normal(k[1], (4, 6, D))


def _params(model, row_bias, x):
    params = MODELS[model](tp=1, row_bias=row_bias).init(jax.random.key(2), x)
    # a trained bias is not zero (linen initializes it to zeros): the bug shows in the loss
    return jax.tree_util.tree_map_with_path(
        lambda path, leaf: leaf + 0.3 if "'o'" in str(path) and "bias" in str(path) else leaf,
        params)


def _single_device(model, params, x, y, row_bias=False):
    m = MODELS[model](tp=1, row_bias=row_bias)
    return jax.value_and_grad(lambda p: jnp.mean((m.apply(p, x) - y) ** 2))(params)


def _body(model, mistake):
    m = MODELS[model](tp=4, row_bias=mistake == "bias_before_psum",
                      psum=mistake != "psum_forgotten")

    def step(params, x, y):
        loss, grads = jax.value_and_grad(
            lambda p: jax.lax.pmean(jnp.mean((m.apply(p, x) - y) ** 2), "dp"))(params)
        if mistake == "pmean_reduced_grads":
            grads = jax.tree.map(lambda g: jax.lax.pmean(g, "dp"), grads)  # the lambda's line
        return loss, grads
    return step


def _run(face, model, mistake, mesh, params, x, y):
    specs = _specs(params, model == "stack")
    body = _body(model, mistake)

    def hinted(params, x: Varying["dp"], y: Varying["dp"]):
        return body(params, x, y)
    program = on_face(face, body, hinted, mesh=mesh, in_specs=(specs, P("dp"), P("dp")),
                      out_specs=(P(), specs))
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    return program(jax.tree.map(put, params, specs), put(x, P("dp")), put(y, P("dp")))


def _line(marker):
    return line_ending_with(__file__, marker)


def _close(got, want):
    loss, grads = got
    ref_loss, ref_grads = want
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    assert jax.tree.structure(grads) == jax.tree.structure(ref_grads)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("face", [*FACES, "jax"])
@pytest.mark.parametrize("model", sorted(MODELS))
def test_correct_step_equals_one_device(model, face, mesh):
    x, y = _data()
    params = _params(model, False, x)
    _close(_run(face, model, None, mesh, params, x, y), _single_device(model, params, x, y))


#: (model, mistake) -> code, a fragment of its fix, the line's marker
MISTAKES = {
    ("block", "bias_before_psum"): ("SPMD210", "reduce first", "# the o line"),
    ("stack", "bias_before_psum"): ("SPMD210", "reduce first", "# the o line"),
    ("block", "psum_forgotten"): ("SPMD210", "reduce first", "# the residual's line"),
    ("stack", "psum_forgotten"): ("SPMD302", "psum it in the body", "# the scan's line"),
    ("block", "pmean_reduced_grads"): ("SPMD103", "drop the jax.lax.pmean", "# the lambda's line"),
    ("stack", "pmean_reduced_grads"): ("SPMD103", "drop the jax.lax.pmean", "# the lambda's line"),
}


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize(("model", "mistake"), sorted(MISTAKES))
def test_mistake_caught_at_its_line(model, mistake, face, mesh):
    x, y = _data()
    params = _params(model, mistake == "bias_before_psum", x)
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, model, mistake, mesh, params, x, y)
    code, fix, marker = MISTAKES[model, mistake]
    assert e.value.code == code and fix in str(e.value), str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line(marker)), str(e.value)
    if marker in ("# the o line", "# the scan's line"):   # flax's own line is a detail
        assert "inside an installed package" in str(e.value) and "flax" in str(e.value)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_bias_bug_is_real_and_the_pmean_redundant(model, mesh):
    """Raw JAX runs both: the bias added before the psum is counted once per tp device (a
    wrong loss against one device); the extra pmean changes no number."""
    x, y = _data()
    params = _params(model, True, x)
    loss, _ = _run("jax", model, "bias_before_psum", mesh, params, x, y)
    ref_loss, _ = _single_device(model, params, x, y, row_bias=True)
    assert not np.isclose(float(loss), float(ref_loss), rtol=1e-3)

    params = _params(model, False, x)
    _close(_run("jax", model, "pmean_reduced_grads", mesh, params, x, y),
           _single_device(model, params, x, y))
