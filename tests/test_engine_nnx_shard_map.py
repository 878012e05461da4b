"""flax's own `nnx.shard_map` docstring example (a tensor-parallel MLP, its kernels placed by
`nnx.StateSharding`, `nnx.jit` around the step), checked unedited by `st.adapters.checking`:
flax calls `jax.shard_map` itself, so the step is all the user can wrap.

- the example as flax documents it: loss and gradients (`nnx.value_and_grad`) equal one
  device's, under `checking()` and raw;
- the same with the row-parallel `nnx.Linear`'s default bias kept (`use_bias=True`): flax adds
  it to the partial sums before the psum; SPMD210 at the model's line that calls the layer
  (raw JAX's loss is wrong against one device);
- the psum left out: SPMD401 with the psum in its fix, at the user's call of the sharded
  function (flax's frame beside it).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _helpers import line_ending_with
from jax.sharding import PartitionSpec as P

import spmdtyped as st

nnx = pytest.importorskip("flax.nnx")
if not hasattr(nnx, "shard_map"):
    pytest.skip("this flax has no nnx.shard_map", allow_module_level=True)


class MLP(nnx.Module):
    def __init__(self, *, bias, rngs):
        self.linear1 = nnx.Linear(2, 64, use_bias=False, rngs=rngs)
        self.linear2 = nnx.Linear(64, 3, use_bias=bias, rngs=rngs,
                                  bias_init=nnx.initializers.constant(0.5))

    def __call__(self, x):
        return self.linear2(jax.nn.relu(self.linear1(x)))  # the model's line


def _program(mistake, face, grad=False):
    mesh = jax.make_mesh((4,), ("model",), axis_types=(jax.sharding.AxisType.Auto,))
    spec = {"linear1": {"kernel": P(None, "model")}, "linear2": {"kernel": P("model", None)}}
    if mistake == "bias_before_psum":
        spec["linear2"]["bias"] = P()

    @nnx.shard_map(mesh=mesh, in_specs=(nnx.StateSharding(nnx.State(spec)), P(None)),
                   out_specs=P(None))
    def f(m, x):
        y = m(x)
        return y if mistake == "psum_forgotten" else jax.lax.psum(y, "model")

    def loss(m, x):
        return jnp.mean(f(m, x) ** 2)  # the call's line

    step = nnx.jit(lambda m, x: nnx.value_and_grad(loss)(m, x)) if grad else nnx.jit(loss)
    return st.adapters.checking(step) if face == "checking" else step


def _model(mistake=None):
    return MLP(bias=mistake == "bias_before_psum", rngs=nnx.Rngs(0))


X = jax.random.normal(jax.random.key(1), (32, 2))


def _one_device(m):
    return nnx.value_and_grad(lambda m, x: jnp.mean(m(x) ** 2))(m, X)


def _line(marker):
    return line_ending_with(__file__, marker)


@pytest.mark.parametrize("face", ["checking", "jax"])
def test_flax_example_equals_one_device(face):
    m = _model()
    ref_loss, ref_grads = _one_device(m)
    np.testing.assert_allclose(float(_program(None, face)(m, X)), float(ref_loss), rtol=1e-5)
    loss, grads = _program(None, face, grad=True)(m, X)
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("grad", [False, True], ids=["loss", "value_and_grad"])
def test_bias_before_the_psum_is_spmd210_at_the_models_line(grad):
    m = _model("bias_before_psum")
    with pytest.raises(st.SpmdTypeError) as e:
        _program("bias_before_psum", "checking", grad=grad)(m, X)
    assert e.value.code == "SPMD210", str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line("# the model's line"))
    assert "flax" in str(e.value)   # flax's own line, beside the model's


def test_the_bias_bug_is_real():
    m = _model("bias_before_psum")
    ref_loss, _ = _one_device(m)
    assert not np.isclose(float(_program("bias_before_psum", "jax")(m, X)), float(ref_loss),
                          rtol=1e-3)


def test_psum_forgotten_is_spmd401_at_the_call():
    with pytest.raises(st.SpmdTypeError) as e:
        _program("psum_forgotten", "checking")(_model(), X)
    assert e.value.code == "SPMD401" and "psum" in e.value.fix, str(e.value)
    assert (e.value.file, e.value.line) == (__file__, _line("# the call's line"))
