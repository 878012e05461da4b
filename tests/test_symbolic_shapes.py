"""Shape polymorphism (`jax.export` with symbolic dimensions) through every face.

A program exported for a symbolic batch (`export.symbolic_args_specs(args, "2*b, _")`) is
traced with dimension expressions in its shapes: `int()` of one raises JAX's
`InconclusiveDimensionOperation`. The engine read every extent with `int()`, so
`typed_shard_map` crashed on programs JAX exports (found by running JAX's own
`tests/export_test.py`, `test_shard_map_collective_permute_poly_*`, through it). Extents are
now read by `_rules.refine.shape.dims` (a symbolic one kept as it is), so:

- a right program exports under `typed_shard_map`, `st.shard_map` and `jax.jit(checking(step))`
  to the same StableHLO as under `jax.shard_map`, and its exported call computes what the raw
  one does (a ring `ppermute`: JAX 0.10.2 cannot call an exported psum on CPU, "Error refining
  shapes", raw or typed, so the psum programs are compared by their StableHLO);
- the bias added before the psum of a row-parallel projection (written with `jax.nn` and
  `jnp.einsum`, as a function and inside an equinox module) is SPMD210 at its line, with the
  batch symbolic, where `jax.shard_map` exports it silently;
- a training step that takes its gradients in the body (`eqx.filter_value_and_grad`, the
  gradients read from the jaxpr with symbolic shapes) exports to raw's StableHLO, and on a
  concrete batch its loss and gradients equal one device's; its two mistakes (the bias before
  the psum, SPMD210; the gradients pmean'd instead of the loss, SPMD103) are caught at their
  lines with the batch symbolic, each wrong against one device in raw JAX;
- the same step as a flax nnx module of `nnx.Param`s, split outside the shard_map and merged
  in the body, with `nnx.value_and_grad`: raw's StableHLO, one device's loss and gradients,
  and its bias before the psum SPMD210 at the module's line.
"""

from __future__ import annotations

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax import export, lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped.adapters import checking, typed_shard_map

SPECS = (P("dp", None), P(None, "tp"), P("tp", None), P())
POLY = ("2*b, _", None, None, None)


@pytest.fixture(scope="module")
def mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("dp", "tp"))


def mlp(x, w1, w2, b):   # Megatron's row-parallel projection, its bias after the psum
    h = jax.nn.gelu(jnp.einsum("bd,df->bf", x, w1))
    return lax.psum(h @ w2, "tp") + b


def mlp_bias_before_psum(x, w1, w2, b):
    h = jax.nn.gelu(jnp.einsum("bd,df->bf", x, w1))
    return lax.psum(h @ w2 + b, "tp")  # BUG fn


class TPBlock(eqx.Module):
    """Megatron's MLP in equinox, its bias added after the psum of the row-parallel output."""

    w1: jax.Array
    w2: jax.Array
    b: jax.Array

    def __call__(self, x):
        h = jax.nn.gelu(x @ self.w1)
        return lax.psum(h @ self.w2, "tp") + self.b


class Block(TPBlock):
    def __call__(self, x):
        h = jax.nn.relu(x @ self.w1)
        y = h @ self.w2 + self.b  # BUG eqx
        return lax.psum(y, "tp")


def block_body(x, w1, w2, b):
    return Block(w1, w2, b)(x)


def ring(x, w1, w2, b):   # each dp row's shard passed on to the next
    n = lax.axis_size("dp")
    return lax.ppermute(jnp.tanh(x), "dp", perm=[(j, (j + 1) % n) for j in range(n)])


def _args():
    rng = np.random.default_rng(0)
    return (rng.standard_normal((16, 8), np.float32), rng.standard_normal((8, 32), np.float32),
            rng.standard_normal((32, 8), np.float32), rng.standard_normal((8,), np.float32))


def _put(mesh, tree, specs):
    """The arrays of `tree` placed on `mesh` as `specs` (a tree of the same structure) say."""
    return jax.tree.map(lambda a, s: jax.device_put(a, NamedSharding(mesh, s)), tree, specs)


def _shard_map(face):
    """The face's shard_map: raw JAX's, the drop-in, `st.shard_map`, or `checking` of JAX's."""
    return {"raw": jax.shard_map, "typed_shard_map": typed_shard_map, "st.shard_map": st.shard_map,
            "checking": lambda f, **kw: checking(jax.shard_map(f, **kw))}[face]


def _program(face, body, mesh):
    smap = _shard_map(face)
    return jax.jit(smap(body, mesh=mesh, in_specs=SPECS, out_specs=P("dp", None)),
                   in_shardings=tuple(NamedSharding(mesh, s) for s in SPECS))


FACES = ("typed_shard_map", "st.shard_map", "checking")


def _export(program):
    return export.export(program)(*export.symbolic_args_specs(_args(), POLY))


def _code(module):
    """The StableHLO text without its source locations (the two exports' call lines differ)."""
    lines = [re.sub(r" loc\(#loc\d*\)", "", line) for line in module.splitlines()
             if not line.startswith("#loc")]
    return "\n".join(lines)


def _line_of(marker):
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith(marker))


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("body", [mlp, ring], ids=["mlp", "ring"])
def test_a_right_program_exports_as_jax_shard_map_does(face, body, mesh):
    raw = _export(_program("raw", body, mesh))
    typed = _export(_program(face, body, mesh))
    assert str(typed.in_avals[0].shape) == "(2*b, 8)"
    assert _code(typed.mlir_module()) == _code(raw.mlir_module())


@pytest.mark.parametrize("face", FACES)
def test_the_exported_ring_computes_what_the_raw_one_does(face, mesh):
    placed = _put(mesh, _args(), SPECS)
    raw = _export(_program("raw", ring, mesh)).call(*placed)
    typed = _export(_program(face, ring, mesh)).call(*placed)
    x = _args()[0]
    want = np.concatenate(np.split(np.tanh(x), 2)[::-1])   # the two dp rows swapped
    np.testing.assert_allclose(np.asarray(raw), want, rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(typed), np.asarray(raw))


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("body,marker", [(mlp_bias_before_psum, "# BUG fn"),
                                         (block_body, "# BUG eqx")], ids=["function", "eqx"])
def test_the_bias_before_the_psum_is_caught_with_a_symbolic_batch(face, body, marker, mesh):
    _export(_program("raw", body, mesh))   # JAX exports it: the bias is added once per tp device
    with pytest.raises(st.SpmdTypeError) as got:
        _export(_program(face, body, mesh))
    assert got.value.code == "SPMD210"
    assert got.value.source == f"{__file__}:{_line_of(marker)}"


# ------------------------------------ a training step: gradients taken in the body, symbolic batch

class TPBlockBiasFirst(TPBlock):
    def __call__(self, x):
        h = jax.nn.gelu(x @ self.w1)
        return lax.psum(h @ self.w2 + self.b, "tp")  # BUG train


def _train_step(cls, grads_pmean=False):
    """A step as people write it: `eqx.filter_value_and_grad` of the mean squared output,
    pmean'd over dp inside the loss (`grads_pmean`: the loss left per device and the gradients
    pmean'd instead, the data-parallel mistake ported from pmap)."""
    def step(x, w1, w2, b):
        model = cls(w1, w2, b)
        if grads_pmean:
            value, g = eqx.filter_value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
            return lax.pmean((value, g.w1, g.w2, g.b), "dp")  # BUG grads
        value, g = eqx.filter_value_and_grad(
            lambda m: lax.pmean(jnp.mean(m(x) ** 2), "dp"))(model)
        return value, g.w1, g.w2, g.b
    return step


def _one_device(x, w1, w2, b):
    """The step's loss and its gradients on one device (the whole batch, the whole weights)."""
    return jax.value_and_grad(lambda w1, w2, b: jnp.mean((jax.nn.gelu(x @ w1) @ w2 + b) ** 2),
                              argnums=(0, 1, 2))(w1, w2, b)


def _train_program(face, cls, mesh, grads_pmean=False):
    smap = _shard_map(face)
    return jax.jit(smap(_train_step(cls, grads_pmean), mesh=mesh, in_specs=SPECS,
                        out_specs=(P(), *SPECS[1:])),
                   in_shardings=tuple(NamedSharding(mesh, s) for s in SPECS))


@pytest.mark.parametrize("face", FACES)
def test_a_training_step_exports_as_raw_and_its_gradients_equal_one_device(face, mesh):
    """Gradients read from the jaxpr with a symbolic batch (`gradients.read` keys primals by
    shape): the step exports to raw's StableHLO; called on a concrete batch, the typed step's
    loss and gradients equal one device's."""
    raw = _export(_train_program("raw", TPBlock, mesh))
    typed = _export(_train_program(face, TPBlock, mesh))
    assert str(typed.in_avals[0].shape) == "(2*b, 8)"
    assert _code(typed.mlir_module()) == _code(raw.mlir_module())

    want_value, want = _one_device(*_args())
    placed = _put(mesh, _args(), SPECS)
    value, g1, g2, gb = _train_program(face, TPBlock, mesh)(*placed)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    for got, ref in zip((g1, g2, gb), want, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("bug", ["bias_first", "grads_pmean"])
def test_a_wrong_training_step_is_caught_with_a_symbolic_batch(face, bug, mesh):
    """The same step with the bias added before the psum (SPMD210 at the module's line), or
    with the loss left per device and the gradients pmean'd (SPMD103 at the pmean: JAX already
    summed the replicated weights' gradients over dp). JAX exports both; on a concrete batch
    the bias's gradient is wrong, and every gradient of the second is dp times one device's."""
    cls, pmean = (TPBlockBiasFirst, False) if bug == "bias_first" else (TPBlock, True)
    _export(_train_program("raw", cls, mesh, pmean))
    placed = _put(mesh, _args(), SPECS)
    _, g1, _, gb = _train_program("raw", cls, mesh, pmean)(*placed)
    _, (want1, _, want_b) = _one_device(*_args())
    assert not np.allclose(gb, want_b, rtol=1e-3)   # the bug is real: a wrong gradient, silently
    if bug == "grads_pmean":
        np.testing.assert_allclose(g1, 2 * want1, rtol=1e-4, atol=1e-4)   # dp = 2
    with pytest.raises(st.SpmdTypeError) as got:
        _export(_train_program(face, cls, mesh, pmean))
    code, marker = ("SPMD210", "# BUG train") if bug == "bias_first" else ("SPMD103", "# BUG grads")
    assert got.value.code == code
    assert got.value.source == f"{__file__}:{_line_of(marker)}"


# ------------------------------------------ the same step in flax nnx: nnx.value_and_grad in the body

class NNXBlock(nnx.Module):
    """The MLP as a flax nnx module of `nnx.Param`s (`bias_first`: the bias added before the
    psum)."""

    def __init__(self, w1, w2, b, bias_first=False):
        self.w1, self.w2, self.b = nnx.Param(w1), nnx.Param(w2), nnx.Param(b)
        self.bias_first = bias_first

    def __call__(self, x):
        h = jax.nn.gelu(x @ self.w1[...])
        if self.bias_first:
            return lax.psum(h @ self.w2[...] + self.b[...], "tp")  # BUG nnx
        return lax.psum(h @ self.w2[...], "tp") + self.b[...]


#: each `nnx.Param` of `NNXBlock`'s spec, by its attribute
NNX_SPECS = dict(zip(("w1", "w2", "b"), SPECS[1:], strict=True))


def _nnx_program(face, mesh, bias_first=False):
    graphdef, params = nnx.split(NNXBlock(*_args()[1:], bias_first=bias_first), nnx.Param)
    specs = jax.tree_util.tree_map_with_path(lambda path, _: NNX_SPECS[str(path[0].key)], params)

    def step(x, params):
        def loss(m):
            return lax.pmean(jnp.mean(m(x) ** 2), "dp")

        return nnx.value_and_grad(loss)(nnx.merge(graphdef, params))

    smap = _shard_map(face)
    program = jax.jit(smap(step, mesh=mesh, in_specs=(SPECS[0], specs), out_specs=(P(), specs)))
    placed = _put(mesh, (_args()[0], params), (SPECS[0], specs))
    return program, placed


def _nnx_export(program, placed):
    return export.export(program)(*export.symbolic_args_specs(placed, (POLY[0], None)))


@pytest.mark.parametrize("face", FACES)
def test_an_nnx_training_step_exports_as_raw_and_its_gradients_equal_one_device(face, mesh):
    raw = _nnx_export(*_nnx_program("raw", mesh))
    program, placed = _nnx_program(face, mesh)
    typed = _nnx_export(program, placed)
    assert str(typed.in_avals[0].shape) == "(2*b, 8)"
    assert _code(typed.mlir_module()) == _code(raw.mlir_module())
    value, grads = program(*placed)
    want_value, want = _one_device(*_args())
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    for name, ref in zip(("w1", "w2", "b"), want, strict=True):
        np.testing.assert_allclose(grads[name][...], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("face", FACES)
def test_the_bias_before_the_psum_in_an_nnx_module_is_caught_with_a_symbolic_batch(face, mesh):
    program, placed = _nnx_program("raw", mesh, bias_first=True)
    _nnx_export(program, placed)   # JAX exports it
    _, grads = program(*placed)
    assert not np.allclose(grads["b"][...], _one_device(*_args())[1][2], rtol=1e-3)
    with pytest.raises(st.SpmdTypeError) as got:
        _nnx_export(*_nnx_program(face, mesh, bias_first=True))
    assert got.value.code == "SPMD210"
    assert got.value.source == f"{__file__}:{_line_of('# BUG nnx')}"
