"""Explicit mode (no shard_map), measured with `st.report`: the four classes of
`docs/design/global_view.md` on small programs. (1) a `PartitionSpec` rebuilt from its
partitions loses its `unreduced` tag: every einsum then contracts a sharded dimension into a
replicated result, which the report reads from the specs and the compiled program runs: an
all-reduce at every einsum instead of one; (2) an unreduced scan carry is accepted and reduced
once; (3) `P(("dp", "tp"))` and `P("dp", "tp")` are different layouts with the same gather
bytes; (4) an opaque kernel fed an Explicit-sharded array gets an all-gather only the compiler
inserts (SPMD703). And the partial sums of an Explicit-mode contraction (a `dot_general` over a
dimension both operands shard, a `reduce_sum` over a sharded one), predicted from the specs:
alone, and in a training step with `jax.value_and_grad`."""

from __future__ import annotations

import sys
from typing import Any

import _report_programs as rp
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

UNREDUCED = P(unreduced={"tp"})
BATCH = P("dp")


def _operands() -> tuple[Any, Any]:
    mesh = rp.mesh_explicit()
    return (jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh, P(None, "tp"))),
            jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("tp"))))


def _accumulate(spec: P) -> Any:
    def f(a: Any, b: Any) -> Any:
        acc = jnp.einsum("ij,jk->ik", a, b, out_sharding=spec)
        for _ in range(3):
            acc = acc + jnp.einsum("ij,jk->ik", a, b, out_sharding=spec)
        return jax.sharding.reshard(acc, P())
    return f


def test_rebuilt_spec_drops_unreduced_and_the_compiler_reduces_each_time() -> None:
    rebuilt = P(*UNREDUCED.partitions)   # what `P(*spec)` code does once iteration is fixed
    assert rebuilt.unreduced == frozenset()
    with jax.set_mesh(rp.mesh_explicit()):
        kept = st.report(_accumulate(UNREDUCED), *_operands())
        lost = st.report(_accumulate(rebuilt), *_operands())
    assert kept.summary() == kept.summary("compiled") == {("all-reduce", ("tp",)): (1, 256)}
    # the jaxpr says it: each einsum contracts the tp-sharded dimension into a replicated
    # result, a partial sum per device that the compiler all-reduces (4 x instead of once)
    assert lost.summary() == lost.summary("compiled") == {("all-reduce", ("tp",)): (4, 4 * 256)}
    assert {c.origin for c in lost.collectives} == {"jax"}
    assert {c.primitive for c in lost.collectives} == {"dot_general"}
    assert lost.removed == [] and lost.added() == []


def test_unreduced_scan_carry_is_reduced_once() -> None:
    def f(a: Any, b: Any) -> Any:
        def body(c: Any, _: Any) -> Any:
            return c + jnp.einsum("ij,jk->ik", a, b, out_sharding=UNREDUCED), None
        c0 = jnp.einsum("ij,jk->ik", a, b, out_sharding=UNREDUCED)
        return jax.sharding.reshard(jax.lax.scan(body, c0, None, length=4)[0], P())

    with jax.set_mesh(rp.mesh_explicit()):
        rep = st.report(f, *_operands())
    assert rep.summary() == rep.summary("compiled") == {("all-reduce", ("tp",)): (1, 256)}


def test_tuple_axis_spec_is_another_layout_with_the_same_gather() -> None:
    mesh = rp.mesh_explicit()
    shapes, sums = [], []
    for spec in (P(("dp", "tp")), P("dp", "tp")):
        x = jax.device_put(jnp.ones((16, 16)), NamedSharding(mesh, spec))
        with jax.set_mesh(mesh):
            rep = st.report(lambda v: jax.sharding.reshard(v, P("dp")), x)
        shapes.append(x.addressable_shards[0].data.shape)
        sums.append(rep.summary())
        assert rep.summary() == rep.summary("compiled")
    assert shapes == [(2, 16), (8, 4)]
    assert sums[0] == sums[1] == {("all-gather", ("tp",)): (1, 512)}


def test_opaque_kernel_under_explicit_mesh_is_fed_a_compiler_gather() -> None:
    mesh = rp.mesh_explicit()
    x = jax.device_put(jnp.ones((16, 4)), NamedSharding(mesh, P("dp")))

    def f(v: Any) -> Any:
        out = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=NamedSharding(mesh, P()))
        return jax.pure_callback(lambda t: np.asarray(t) * 2, out, v, vmap_method="sequential")

    with jax.set_mesh(mesh):
        rep = st.report(f, x)
    assert rep.collectives == []
    (op,) = rep.added()
    assert (op.kind, op.axes, op.bytes) == ("all-gather", ("dp",), 256)
    assert op.feeds_kernel is not None and "callback" in op.feeds_kernel   # the custom call
    assert [fl.code for fl in rep.flags] == ["SPMD703"]


def test_scan_carry_that_loses_unreduced_is_rejected_by_jax() -> None:
    """JAX's own rejection (both versions): the carry types differ, `{U:tp}` vs nothing."""
    import pytest

    def f(a: Any, b: Any) -> Any:
        def body(c: Any, _: Any) -> Any:
            c = c + jnp.einsum("ij,jk->ik", a, b, out_sharding=UNREDUCED)
            return jax.sharding.reshard(c, P()), None
        c0 = jnp.einsum("ij,jk->ik", a, b, out_sharding=UNREDUCED)
        return jax.lax.scan(body, c0, None, length=4)[0]

    with jax.set_mesh(rp.mesh_explicit()), pytest.raises(Exception, match=r"\{U:tp\}"):
        jax.jit(f).trace(*_operands())


# ------------------------------------------------------------- partial sums of contractions


@pytest.mark.parametrize("out", [P(), P("tp"), P("dp"), P(None, "tp")])
def test_contraction_over_a_sharded_dimension_is_an_all_reduce(out: P) -> None:
    """(8,16@tp) @ (16@tp,8): every device holds a partial sum of the whole result; the
    compiler all-reduces it over tp (before splitting it over tp, when `out` names tp), at the
    result's size per device over the other axes."""
    line = 0

    def f(a: Any, b: Any) -> Any:
        nonlocal line
        line = sys._getframe().f_lineno + 1
        return jnp.einsum("ij,jk->ik", a, b, out_sharding=out)

    with jax.set_mesh(rp.mesh_explicit()):
        rep = st.report(f, *_operands())
    split = 2 if "dp" in out else 1
    assert rep.summary() == rep.summary("compiled") == {("all-reduce", ("tp",)): (1, 256 // split)}
    (c,) = rep.collectives
    assert (c.primitive, c.origin, c.phase) == ("dot_general", "jax", "forward")
    assert c.where == f"{__file__}:{line}"
    assert rep.removed == [] and rep.added() == []


def _mlp_loss(w1: Any, w2: Any, x: Any, y: Any, spec: P | None) -> Any:
    h = jax.nn.relu(x @ w1)                             # (32@dp, 64@tp): no communication
    out = jnp.dot(h, w2, out_sharding=spec)             # contracts tp: an all-reduce over tp
    return jnp.mean((out - y) ** 2)                     # a sum over the dp-sharded batch


def _train_step(w1: Any, w2: Any, x: Any, y: Any, spec: P | None = BATCH) -> Any:
    loss, (g1, g2) = jax.value_and_grad(_mlp_loss, argnums=(0, 1))(w1, w2, x, y, spec)
    return w1 - 0.1 * g1, w2 - 0.1 * g2, loss


def test_explicit_training_step_forward_and_backward_partial_sums() -> None:
    mesh = rp.mesh_explicit()
    k = jax.random.split(jax.random.key(0), 4)
    raw = (jax.random.normal(k[0], (16, 64)) / 4, jax.random.normal(k[1], (64, 8)) / 4,
           jax.random.normal(k[2], (32, 16)), jax.random.normal(k[3], (32, 8)))
    specs = (P(None, "tp"), P("tp", None), P("dp"), P("dp"))
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip(raw, specs, strict=True)]
    with jax.set_mesh(mesh):
        rep = st.report(jax.jit(_train_step), *args)
        got = jax.jit(_train_step)(*args)
    want = _train_step(*raw, spec=None)                 # one device, no shardings
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert rep.summary() == rep.summary("compiled")
    assert rep.removed == [] and rep.added() == []
    by_phase = rep.summary(by_phase=True)
    # forward: the h @ w2 partial sums over tp (32/dp x 8 floats), the loss's sum over dp
    assert by_phase[("all-reduce", ("tp",), "forward")] == (1, 16 * 8 * 4)
    assert by_phase[("all-reduce", ("dp",), "forward")] == (1, 4)
    # backward: the weight gradients contract the dp-sharded batch: an all-reduce over dp of
    # each gradient at its tp shard's size (data parallelism, read from the specs)
    assert by_phase[("all-reduce", ("dp",), "backward")] == (2, 16 * 64 // 4 * 4 + 64 // 4 * 8 * 4)
    assert {c.origin for c in rep.collectives} == {"jax"}
    assert all(c.where and c.where.startswith(f"{__file__}:") for c in rep.collectives)
