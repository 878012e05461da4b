"""Grouped-query attention in a flax nnx module under head (tensor) parallelism, trained with
`nnx.value_and_grad`: `nnx.Linear` projections (the query one column-parallel over tp, the key /
value ones replicated, since there are fewer key / value heads than tp devices, the output one
row-parallel with its psum), `jax.nn.dot_product_attention` inside the module's `__call__`.

The mistake people make when the key / value heads are replicated: each device pairs its two
query heads with key / value heads 0.. instead of its own group's. JAX runs it, wrong on every
device but the first (checked against one device here); spmdtyped reports SPMD215 at the
module's attention line on `typed_shard_map`, `checking()` and `st.shard_map`, in the forward
pass of the differentiated loss. The right form (the group sliced by `axis_index`) is quiet and
its loss and gradients equal one device's under the three faces and raw JAX.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import pytest
from _helpers import assert_each_differs, assert_trees_close, line_ending_with, run_state_step
from flax import nnx
from jax.sharding import PartitionSpec as P

import spmdtyped as st

B, T, DM, HQ, HKV, D, TP = 4, 8, 16, 8, 2, 4, 4
FACES = ["typed_shard_map", "checking", "st.shard_map"]


class GQA(nnx.Module):
    """Llama's attention: HQ query heads, HKV key / value heads shared by groups of HQ // HKV."""

    def __init__(self, rngs: nnx.Rngs):
        self.q = nnx.Linear(DM, HQ * D, use_bias=False, rngs=rngs)
        self.k = nnx.Linear(DM, HKV * D, use_bias=False, rngs=rngs)
        self.v = nnx.Linear(DM, HKV * D, use_bias=False, rngs=rngs)
        self.o = nnx.Linear(HQ * D, DM, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array, *, tp: str | None = None, fixed: bool = True) -> jax.Array:
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, -1, D)   # this device's query heads (all HQ on one device)
        k = self.k(x).reshape(b, t, HKV, D)
        v = self.v(x).reshape(b, t, HKV, D)
        if tp is not None and fixed:   # this device's query heads are one group's
            kv = jax.lax.axis_index(tp) * (HQ // TP) // (HQ // HKV)
            k = jax.lax.dynamic_slice_in_dim(k, kv, 1, axis=2)
            v = jax.lax.dynamic_slice_in_dim(v, kv, 1, axis=2)
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # the module's attention line
        y = self.o(o.reshape(b, t, -1))
        return y if tp is None else jax.lax.psum(y, tp)


GRAPHDEF, STATE = nnx.split(GQA(nnx.Rngs(7)))
SPECS = jax.tree.map(lambda _: P(), STATE)
SPECS["q"]["kernel"].set_value(P(None, "tp"))   # column-parallel: the query heads
SPECS["o"]["kernel"].set_value(P("tp", None))   # row-parallel
IO = dict(in_specs=(SPECS, P("dp"), P("dp")), out_specs=(P(), SPECS))


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, TP), ("dp", "tp"))


def _loss(model: GQA, x: jax.Array, y: jax.Array, **kw: Any) -> jax.Array:
    return jnp.mean((model(x, **kw) - y) ** 2)


def _body(fixed: bool):
    def step(state, x, y):
        model = nnx.merge(GRAPHDEF, state)
        # the loss averaged over dp inside the differentiated function: JAX's backward pass
        # sums the replicated kernels' gradients over dp and tp itself
        return nnx.value_and_grad(
            lambda m: jax.lax.pmean(_loss(m, x, y, tp="tp", fixed=fixed), "dp"))(model)
    return step


def _run(face: str, fixed: bool, mesh: Any) -> Any:
    return run_state_step(face, _body(fixed), mesh=mesh, state=STATE, specs=SPECS,
                          batch=_batch(), **IO)


def _batch() -> tuple[jax.Array, jax.Array]:
    k = jax.random.split(jax.random.key(81), 2)
    return jax.random.normal(k[0], (B, T, DM)), jax.random.normal(k[1], (B, T, DM))


def _reference() -> tuple[jax.Array, Any]:
    x, y = _batch()
    return nnx.value_and_grad(lambda m: _loss(m, x, y))(nnx.merge(GRAPHDEF, STATE))


def _line(marker: str) -> int:
    return line_ending_with(__file__, marker)


@pytest.mark.parametrize("face", [*FACES, "jax"])
def test_each_device_attending_its_own_group_trains_equal_to_one_device(face, mesh):
    loss, grads = _run(face, True, mesh)
    want_loss, want_grads = _reference()
    assert_trees_close((loss, grads), (want_loss, want_grads), atol=1e-5)


def test_the_gqa_mistake_is_wrong_against_one_device(mesh):
    loss, grads = _run("jax", False, mesh)
    want_loss, want_grads = _reference()
    assert_each_differs((loss, want_loss),
                        (grads["k"]["kernel"][...], want_grads["k"]["kernel"][...]))


@pytest.mark.parametrize("face", FACES)
def test_replicated_kv_heads_against_sharded_q_heads_is_spmd215_at_the_module_line(face, mesh):
    with pytest.raises(st.SpmdTypeError) as e:
        _run(face, False, mesh)
    assert e.value.code == "SPMD215", str(e.value)
    assert "axis_index('tp')" in e.value.fix, e.value.fix
    assert (e.value.file, e.value.line) == (__file__, _line("# the module's attention line")), \
        str(e.value)
