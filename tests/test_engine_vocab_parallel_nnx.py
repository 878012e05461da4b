"""A vocabulary-parallel language-model head in flax nnx, trained with `nnx.value_and_grad`: an
`nnx.Embed` whose table is sharded over tp on its vocabulary dim and an `nnx.Linear` head
sharded over tp on its output (vocabulary) dim, `jnp` / `jax.nn` / `jax.lax` inside the module.

Two mistakes people make with library layers that do not know about the shard, each silently
wrong in raw JAX (checked against one device here), each reported by spmdtyped at the user's
line that called into the library (the violation is inside flax's or optax's code):

- `self.embed(ids)`: flax's own lookup (`jnp.take`) with the global ids into this device's
  rows of the table: SPMD215 (an index replicated over tp picking along a dim sharded over
  tp), at the module's call of the layer;
- `optax.softmax_cross_entropy_with_integer_labels` of the vocabulary-sharded logits: the
  label's logit read with the global labels from the local shard and a log-sum-exp over the
  local vocabulary only: SPMD215 at the module's call of optax (the first of the two in the
  program).

The hand-written masked lookup and cross-entropy (`pmax` / `psum` over tp) equal one device in
loss and gradients on `typed_shard_map`, `checking()`, `st.shard_map` and raw JAX.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from _helpers import assert_trees_close, line_ending_with, run_state_step
from flax import nnx
from jax.sharding import PartitionSpec as P

import spmdtyped as st

B, T, V, D, TP = 4, 8, 32, 8, 4
FACES = ["typed_shard_map", "checking", "st.shard_map"]


def _masked_lookup(table: jax.Array, ids: jax.Array) -> jax.Array:
    """This device's rows of the table for the ids that fall in its shard, summed over tp."""
    n = table.shape[0]
    local = ids - jax.lax.axis_index("tp") * n
    inside = (local >= 0) & (local < n)
    rows = jnp.take(table, jnp.clip(local, 0, n - 1), axis=0)
    return jax.lax.psum(jnp.where(inside[..., None], rows, 0.0), "tp")


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy of logits whose last (vocabulary) dim is sharded over tp."""
    n = logits.shape[-1]
    m = jax.lax.pmax(jax.lax.stop_gradient(logits.max(axis=-1)), "tp")
    lse = jnp.log(jax.lax.psum(jnp.exp(logits - m[..., None]).sum(-1), "tp")) + m
    local = labels - jax.lax.axis_index("tp") * n
    inside = (local >= 0) & (local < n)
    picked = jnp.take_along_axis(logits, jnp.clip(local, 0, n - 1)[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - jax.lax.psum(jnp.where(inside, picked, 0.0), "tp"))


class LM(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.embed = nnx.Embed(V, D, rngs=rngs)
        self.head = nnx.Linear(D, V, use_bias=False, rngs=rngs)

    def loss(self, ids: jax.Array, labels: jax.Array, mistake: str = "",
             tp: bool = True) -> jax.Array:
        if not tp:   # one device: the library layers as their docs use them
            return optax.softmax_cross_entropy_with_integer_labels(
                self.head(jnp.tanh(self.embed(ids))), labels).mean()
        if mistake == "embed_call":
            h = jax.lax.psum(self.embed(ids), "tp")  # MISTAKE: embed_call
        else:
            h = _masked_lookup(self.embed.embedding[...], ids)
        logits = self.head(jnp.tanh(h))
        if mistake == "optax_loss":
            return jax.lax.pmean(optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean(), "tp")  # MISTAKE: optax_loss
        return _cross_entropy(logits, labels)


GRAPHDEF, STATE = nnx.split(LM(nnx.Rngs(5)))
SPECS = jax.tree.map(lambda _: P(), STATE)
SPECS["embed"]["embedding"].set_value(P("tp", None))
SPECS["head"]["kernel"].set_value(P(None, "tp"))
IO = dict(in_specs=(SPECS, P("dp"), P("dp")), out_specs=(P(), SPECS))


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, TP), ("dp", "tp"))


def _body(mistake: str):
    def step(state, ids, labels):
        model = nnx.merge(GRAPHDEF, state)
        return nnx.value_and_grad(
            lambda m: jax.lax.pmean(m.loss(ids, labels, mistake), "dp"))(model)
    return step


def _data() -> tuple[jax.Array, jax.Array]:
    k = jax.random.split(jax.random.key(18), 2)
    return (jax.random.randint(k[0], (B, T), 0, V), jax.random.randint(k[1], (B, T), 0, V))


def _run(face: str, mistake: str, mesh: Any) -> Any:
    return run_state_step(face, _body(mistake), mesh=mesh, state=STATE, specs=SPECS,
                          batch=_data(), **IO)


def _reference() -> Any:
    ids, labels = _data()
    return nnx.value_and_grad(lambda m: m.loss(ids, labels, tp=False))(nnx.merge(GRAPHDEF, STATE))


def _line(mistake: str) -> int:
    return line_ending_with(__file__, f"# MISTAKE: {mistake}")


@pytest.mark.parametrize("face", [*FACES, "jax"])
def test_vocab_parallel_nnx_head_trains_equal_to_one_device(face, mesh):
    loss, grads = _run(face, "", mesh)
    want_loss, want = _reference()
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-5)
    assert_trees_close(grads, want)


@pytest.mark.parametrize("mistake", ["embed_call", "optax_loss"])
def test_each_library_layer_mistake_is_wrong_against_one_device(mistake, mesh):
    loss, _grads = _run("jax", mistake, mesh)
    assert not np.isclose(float(loss), float(_reference()[0]), rtol=1e-2)


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("mistake", ["embed_call", "optax_loss"])
def test_a_library_layer_fed_the_global_ids_is_spmd215_at_the_users_call(mistake, face, mesh):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, mistake, mesh)
    assert e.value.code == "SPMD215", str(e.value)
    assert "axis_index('tp')" in e.value.fix, e.value.fix
    assert (e.value.file, e.value.line) == (__file__, _line(mistake)), str(e.value)
    # the package's own line beside it; optax's norm counterparts only where its norm ran
    assert "inside an installed package" in str(e.value)
    assert "st.clip_by_global_norm" not in str(e.value), str(e.value)
