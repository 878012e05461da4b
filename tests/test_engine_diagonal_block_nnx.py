"""Sequence-parallel attention in a flax nnx module, trained with `nnx.value_and_grad`:
`nnx.Linear` projections (replicated), flax's own `nnx.dot_product_attention` inside the
module's `__call__` (or the scores written elementwise, `(q[:, :, None] * k[:, None,
:]).sum(-1)`), the batch sharded over dp and the sequence over sp.

The mistake: the keys and values left local (the all-gather over sp forgotten), so each
device attends its own block of the sequence only. JAX runs it, wrong against one device in
the loss and the gradients; spmdtyped reports SPMD216 at the module's attention line on
`typed_shard_map`, `checking()` and `st.shard_map`, in the forward pass of the differentiated
loss. With the keys and values all-gathered over sp the step is quiet and equals one device's
loss and gradients under the three faces and raw JAX.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from _helpers import assert_each_differs, assert_trees_close, line_ending_with, on_face
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import Varying

B, S, DM, H, D = 2, 16, 8, 2, 4
SEQ = P("dp", "sp")
FACES = ["typed_shard_map", "checking", "st.shard_map"]


class SelfAttention(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.q = nnx.Linear(DM, H * D, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(DM, H * D, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(DM, H * D, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(H * D, DM, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array, *, sp: str | None = None,
                 broadcast: bool = False) -> jax.Array:
        b, s, _ = x.shape
        q, k, v = (f(x).reshape(b, s, H, D) for f in (self.q, self.k, self.v))
        if sp is not None:   # every device's queries against the whole sequence's keys
            k, v = (jax.lax.all_gather(a, sp, axis=1, tiled=True) for a in (k, v))
        if broadcast:   # the scores as a table of pairs written elementwise
            w = (q[:, :, None] * k[:, None, :]).sum(-1) / D ** 0.5  # the module's scores line
            o = jnp.einsum("bqkh,bkhd->bqhd", jax.nn.softmax(w, axis=2), v)
        else:
            o = nnx.dot_product_attention(q, k, v)  # the module's attention line
        return x + self.o(o.reshape(b, s, H * D))


GRAPHDEF, STATE = nnx.split(SelfAttention(nnx.Rngs(3)))
SPECS = jax.tree.map(lambda _: P(), STATE)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("dp", "sp"))


def _loss(model: SelfAttention, x: jax.Array, y: jax.Array, **kw: Any) -> jax.Array:
    return jnp.mean((model(x, **kw) - y) ** 2)


def _body(gather: bool, broadcast: bool):
    def step(state, x, y):
        model = nnx.merge(GRAPHDEF, state)
        sp = "sp" if gather else None
        return nnx.value_and_grad(lambda m: jax.lax.pmean(
            _loss(m, x, y, sp=sp, broadcast=broadcast), ("dp", "sp")))(model)
    return step


def _batch() -> tuple[jax.Array, jax.Array]:
    k = jax.random.split(jax.random.key(216), 2)
    return jax.random.normal(k[0], (B, S, DM)), jax.random.normal(k[1], (B, S, DM))


def _run(face: str, gather: bool, mesh: Any, broadcast: bool) -> Any:
    body = _body(gather, broadcast)

    def hinted(state: Any, x: Varying["dp", "sp"], y: Varying["dp", "sp"]) -> Any:
        return body(state, x, y)

    program = on_face(face, body, hinted, mesh=mesh, in_specs=(SPECS, SEQ, SEQ),
                      out_specs=(P(), SPECS))
    put = lambda a, s: jax.device_put(a, NamedSharding(mesh, s))  # noqa: E731
    return program(jax.tree.map(put, STATE, SPECS), *(put(a, SEQ) for a in _batch()))


def _reference(broadcast: bool) -> tuple[jax.Array, Any]:
    x, y = _batch()
    return nnx.value_and_grad(lambda m: _loss(m, x, y, broadcast=broadcast))(
        nnx.merge(GRAPHDEF, STATE))


#: how the module computes its scores -> the line SPMD216 names when the keys stay local
SCORES = {"nnx.dot_product_attention": "# the module's attention line",
          "broadcast": "# the module's scores line"}


@pytest.mark.parametrize("face", [*FACES, "jax"])
@pytest.mark.parametrize("scores", sorted(SCORES))
def test_keys_gathered_over_sp_train_equal_to_one_device(scores, face, mesh):
    broadcast = scores == "broadcast"
    loss, grads = _run(face, True, mesh, broadcast)
    assert_trees_close((loss, grads), _reference(broadcast), atol=1e-5)


@pytest.mark.parametrize("scores", sorted(SCORES))
def test_keys_left_local_are_wrong_against_one_device(scores, mesh):
    broadcast = scores == "broadcast"
    loss, grads = _run("jax", False, mesh, broadcast)
    want_loss, want_grads = _reference(broadcast)
    assert_each_differs((loss, want_loss),
                        (grads["k"]["kernel"][...], want_grads["k"]["kernel"][...]))


@pytest.mark.parametrize("face", FACES)
@pytest.mark.parametrize("scores", sorted(SCORES))
def test_keys_left_local_are_spmd216_at_the_module_line(scores, face, mesh):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, False, mesh, scores == "broadcast")
    assert e.value.code == "SPMD216", str(e.value)
    assert (e.value.file, e.value.line) == (
        __file__, line_ending_with(__file__, SCORES[scores])), str(e.value)
