"""Explicit mode (no shard_map), measured with `st.report`: the four classes of
`docs/design/global_view.md` on small programs. (1) a `PartitionSpec` rebuilt from its
partitions loses its `unreduced` tag: the jaxpr shows no collective, the compiled program
all-reduces at every einsum instead of once; (2) an unreduced scan carry is accepted and reduced
once; (3) `P(("dp", "tp"))` and `P("dp", "tp")` are different layouts with the same gather
bytes; (4) an opaque kernel fed an Explicit-sharded array gets an all-gather only the compiler
inserts (SPMD703)."""

from __future__ import annotations

from typing import Any

import _report_programs as rp
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st

UNREDUCED = P(unreduced={"tp"})


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
    assert lost.collectives == []            # nothing in the jaxpr says it communicates
    (kind, _axes), = lost.summary("compiled")
    count, nbytes = lost.summary("compiled")[(kind, _axes)]
    assert (kind, count, nbytes) == ("all-reduce", 4, 4 * 256)
    assert all(op.origin == "compiler" for op in lost.compiled)


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
