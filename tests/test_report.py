"""`st.report`: every collective of a step from the jaxpr equals what the compiled program runs
(the examples, gradient accumulation both ways, Explicit mode, typed and raw shard_map), the
differences the compiler makes are named, and each SPMD7xx flag has a program that raises it
and a fixed one that does not. The abstract-mesh report and the CLI are in
`test_report_scale.py`."""

from __future__ import annotations

import functools
import importlib
import sys
from pathlib import Path
from typing import Any

import _report_programs as rp
import jax
import numpy as np
import pytest

import spmdtyped as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: every example with a `programs(mesh)` step (equinox/flax ones need their libraries)
EXAMPLES = ["collective_matmul", "data_parallel", "megatron_mlp", "moe", "pipeline",
            "ring_attention", "sequence_parallel", "transformer", "zero3"]
#: what XLA does to each example's collectives: it merges all-reduces into tuple ops (the
#: all-reduce combiner); counts and bytes per operand stay the same
COMBINED = {"data_parallel", "transformer", "moe"}


@functools.cache
def _example(name: str) -> tuple[Any, tuple[Any, ...], Any]:
    m = importlib.import_module(f"examples.{name}")
    mesh = m.make_mesh()
    return m.programs(mesh), tuple(m.make_inputs(mesh)), mesh


@functools.cache
def _report(name: str, which: int = 0) -> Any:
    """One report per example program (each compiles it), shared by the tests below."""
    progs, args, _ = _example(name)
    return st.report(progs[which], *args)


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_traced_equals_compiled(name: str) -> None:
    rep = _report(name)
    assert rep.was_compiled and rep.collectives
    # kind, axes, count, bytes: the jaxpr's account is what runs
    assert rep.summary() == rep.summary("compiled")
    assert rep.removed == [] and rep.added() == []
    assert all(op.origin in ("user", "autodiff", "jax") for op in rep.compiled)
    assert any("combined by the compiler" in d for d in rep.differences()) == (name in COMBINED)
    assert all(c.where and c.where.split(":")[0].endswith(f"{name}.py")
               for c in rep.collectives), [c.where for c in rep.collectives]


@pytest.mark.parametrize("name", ["data_parallel", "megatron_mlp", "zero3"])
def test_typed_and_raw_shard_map_have_the_same_report(name: str) -> None:
    typed, raw = _report(name, 0), _report(name, 1)

    def strip(rep: Any) -> list[dict[str, Any]]:
        return [{k: v for k, v in c.items() if k != "where"} for c in rep.to_json()["collectives"]]

    assert strip(typed) == strip(raw)
    assert typed.to_json()["compiled"] == raw.to_json()["compiled"]


def test_data_parallel_backward_is_autodiff_at_the_users_line() -> None:
    rep = _report("data_parallel")
    from examples import data_parallel

    fwd = [c for c in rep.collectives if c.phase == "forward"]
    bwd = [c for c in rep.collectives if c.phase == "backward"]
    line = data_parallel.loss_fn.__code__.co_firstlineno
    # pmean of the loss: the user's; the gradient psums: transposes of the implicit pvarys of
    # w and b in `x @ w + b` (the line above the pmean)
    assert [(c.origin, c.where.rsplit(":", 1)[1]) for c in fwd] == [("user", str(line + 2))]
    assert {(c.origin, c.where.rsplit(":", 1)[1]) for c in bwd} == {("autodiff", str(line + 1))}
    assert sum(c.bytes for c in bwd) == 4 * (8 + 1)   # gw f32[8] + gb f32[]
    assert rep.flags == []


def test_to_json_is_the_interface() -> None:
    out = _report("megatron_mlp").to_json()
    assert set(out) == {"collectives", "compiled", "flags"}
    c, = out["collectives"]
    assert c == {"kind": "all-reduce", "axes": ["tp"], "count": 1, "bytes": 256,
                 "phase": "forward", "origin": "user", "where": c["where"]}
    assert c["where"].endswith("megatron_mlp.py:37")
    assert out["compiled"] == [{"kind": "all-reduce", "axes": ["tp"], "count": 1, "bytes": 256,
                                "origin": "user"}]
    assert out["flags"] == []


def test_table_groups_by_axes_sorted_by_bytes_and_html_is_self_contained() -> None:
    rep = _report("transformer")
    text = rep.table()
    assert text.index("axes tp: 36.0 KiB") < text.index("axes dp: 24.0 KiB")
    block = text.split("axes tp:")[1].split("axes dp:")[0]
    sizes = [float(line.split()[4]) for line in block.splitlines()[2:] if line.strip()]
    assert sizes == sorted(sizes, reverse=True)
    page = rep.html()
    assert page.startswith("<!doctype html>") and "<script" not in page and "http" not in page
    assert rep.totals() == rep.totals("compiled")
    assert rep.totals()["axes"] == {"tp": 36864, "dp": 24580}


# ------------------------------------------------------------- gradient accumulation


def test_gradient_accumulation_both_ways_same_numbers_ratio_is_microbatches() -> None:
    (per, per_args), (dfr, dfr_args) = (rp.accumulation(w, concrete=True)
                                        for w in ("per_micro", "deferred"))
    np.testing.assert_allclose(np.asarray(per(*per_args)), np.asarray(dfr(*dfr_args)),
                               rtol=1e-5, atol=1e-6)
    a, b = st.report(per, *per_args), st.report(dfr, *dfr_args)
    ar = lambda r: sum(c.bytes for c in r.collectives if c.kind == "all-reduce")  # noqa: E731
    assert ar(a) == rp.MICRO * ar(b) == rp.MICRO * 4 * rp.D * rp.D
    assert a.summary() == a.summary("compiled") and b.summary() == b.summary("compiled")
    (flag,) = a.flags
    assert flag.code == "SPMD701" and flag.axes == ("dp",)
    assert flag.where == f"{rp.__file__}:{rp.line_of(rp._accum_per_micro, 'SPMD701')}"
    assert f"{rp.MICRO} iterations" in flag.message
    assert b.flags == []
    (c,) = a.collectives
    assert c.count == rp.MICRO and c.loops == (("scan", rp.MICRO),)


def test_implicit_gradient_psum_per_microbatch_is_flagged_701_and_705() -> None:
    step, args = rp.accumulation("implicit")
    rep = st.report(step, *args)
    assert [f.code for f in rep.flags] == ["SPMD701", "SPMD705"]
    (c,) = rep.collectives
    assert (c.phase, c.origin, c.count) == ("backward", "autodiff", rp.MICRO)
    assert "4.00x the ideal" in rep.flags[1].message


def test_typed_deferred_accumulation_is_not_flagged() -> None:
    step, args = rp.accumulation("typed")
    rep = st.report(step, *args)
    assert rep.flags == [] and rep.summary() == rep.summary("compiled")
    assert rep.summary() == {("all-reduce", ("dp",)): (1, 4 * rp.D * rp.D)}


def test_compiler_removes_a_dead_psum() -> None:
    """The psum of a loss nobody uses: in the jaxpr, not in the compiled program."""
    def body(w: Any, xs: Any) -> Any:
        def inner(acc: Any, x: Any) -> Any:
            g = jax.grad(lambda w: jax.lax.psum(rp._loss(w, x), "dp"))(w)
            return acc + g, None
        return jax.lax.scan(inner, jax.numpy.zeros_like(w), xs)[0]

    step = jax.jit(jax.shard_map(body, mesh=rp.mesh_dp(), in_specs=(jax.P(), jax.P(None, "dp")),
                                 out_specs=jax.P()))
    _, args = rp.accumulation("implicit")
    rep = st.report(step, *args)
    (dead, n), = rep.removed
    assert (dead.kind, dead.unit_bytes, dead.phase, n) == ("all-reduce", 4, "forward", rp.MICRO)
    assert rep.summary("compiled") == {("all-reduce", ("dp",)): (rp.MICRO, 4 * rp.MICRO * rp.D ** 2)}
    assert any(d.startswith("removed by the compiler: all-reduce over dp x4")
               for d in rep.differences())


# ------------------------------------------------------------- flags


@pytest.mark.parametrize("code", sorted(rp.FLAGGED))
def test_flag_raised_and_fixed(code: str) -> None:
    bad = st.report(*_flat(rp.flagged(code)))
    good = st.report(*_flat(rp.flagged(code, fixed=True)))
    assert [f.code for f in bad.flags] == [code]
    assert bad.flags[0].where == f"{rp.__file__}:{rp.line_of(rp.FLAGGED[code][0], code)}"
    assert good.flags == []
    for rep in (bad, good):
        assert rep.summary() == rep.summary("compiled")
    with pytest.raises(st.CommunicationError) as info:
        bad.check()
    assert info.value.code == code and f"explain {code}" in str(info.value)
    good.check()


def test_psum_scatter_sends_half_of_psum_then_slice() -> None:
    bad = st.report(*_flat(rp.flagged("SPMD704")))
    good = st.report(*_flat(rp.flagged("SPMD704", fixed=True)))
    (a,), (b,) = bad.collectives, good.collectives
    assert (a.kind, b.kind) == ("all-reduce", "reduce-scatter")
    # 2(n-1)/n of the array vs (n-1)/n of it on the wire
    assert bad.wire_bytes(a) == pytest.approx(2 * good.wire_bytes(b))


def _flat(made: tuple[Any, tuple[Any, ...]]) -> tuple[Any, ...]:
    return (made[0], *made[1])


# ------------------------------------------------------------- Explicit mode


def test_explicit_reshard_is_an_all_gather() -> None:
    fn, args = rp.explicit("gather")
    with jax.set_mesh(rp.mesh_explicit()):
        rep = st.report(fn, *args)
    (c,) = rep.collectives
    assert (c.kind, c.axes, c.origin, c.bytes) == ("all-gather", ("dp",), "jax", 16 * 4 * 4)
    assert c.where == f"{rp.__file__}:{rp.explicit_gather.__code__.co_firstlineno + 1}"
    assert rep.summary() == rep.summary("compiled")


def test_explicit_unreduced_spec_reshard_is_an_all_reduce() -> None:
    fn, args = rp.explicit("unreduced")
    with jax.set_mesh(rp.mesh_explicit()):
        rep = st.report(fn, *args)
    (c,) = rep.collectives
    assert (c.kind, c.axes, c.bytes) == ("all-reduce", ("tp",), 8 * 8 * 4)
    assert rep.summary() == rep.summary("compiled")
