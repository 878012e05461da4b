"""`st.report`: gradient accumulation written both ways (same numbers, the volume ratio is the
number of microbatches, the first flagged at its line), a psum the compiler removes, each
SPMD7xx flag with a program that raises it and a fixed one that does not, Explicit-mode
reshards (no shard_map). The examples are in `test_report_examples.py`, the abstract mesh and
the CLI in `test_report_scale.py`."""

from __future__ import annotations

from typing import Any

import _report_programs as rp
import jax
import numpy as np
import pytest

import spmdtyped as st

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
    flag, volume = a.flags
    assert flag.code == "SPMD701" and flag.axes == ("dp",)
    # the user's psum of each microbatch's gradient: 4x the parameter bytes per step
    assert volume.code == "SPMD705" and f"{rp.MICRO:.2f}x the ideal" in volume.message
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


# ------------------------------------------------------------- loops


def _while_program(bound: Any, hoistable: bool = False) -> tuple[Any, tuple[Any, ...]]:
    def body(x: Any, n: Any) -> Any:
        def step(c: Any) -> Any:
            i, v, acc = c
            # psum(x) does not change in the loop (XLA hoists it); psum(v) does
            return i + 1, v * 1.5, acc + jax.lax.psum(x if hoistable else v, "dp")
        upper = 3 if bound == "literal" else n[0]
        init = (0, x, jax.numpy.zeros(x.shape))
        return jax.lax.while_loop(lambda c: c[0] < upper, step, init)[2]

    mesh = rp.mesh_dp()
    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(jax.P("dp"), jax.P()),
                              out_specs=jax.P()))
    n = jax.ShapeDtypeStruct((1,), jax.numpy.int32,
                             sharding=jax.sharding.NamedSharding(mesh, jax.P()))
    return f, (jax.ShapeDtypeStruct((64, 4), jax.numpy.float32,
                                    sharding=jax.sharding.NamedSharding(mesh, jax.P("dp"))), n)


def test_while_loop_trip_count_read_from_literals_and_from_xla() -> None:
    rep = st.report(*_flat(_while_program("literal")))
    (c,) = rep.collectives
    assert (c.count, c.loops) == (3, (("while", 3),))
    assert rep.summary() == rep.summary("compiled") == {("all-reduce", ("dp",)): (3, 3 * 128)}
    assert rep.unknown_trips == [] and not any(op.unknown_trip for op in rep.compiled)


def test_compiler_hoists_a_loop_invariant_psum_out_of_the_loop() -> None:
    rep = st.report(*_flat(_while_program("literal", hoistable=True)))
    assert rep.summary() == {("all-reduce", ("dp",)): (3, 3 * 128)}
    assert rep.summary("compiled") == {("all-reduce", ("dp",)): (1, 128)}
    ((c, n),) = rep.removed
    assert n == 2 and c.loops == (("while", 3),)


def test_while_loop_with_a_traced_bound_is_counted_once_and_noted() -> None:
    rep = st.report(*_flat(_while_program("traced")))
    (c,) = rep.collectives
    assert (c.count, c.loops) == (1, (("while", None),))
    assert len(rep.unknown_trips) == 1 and "no readable trip count" in rep.table()
    (op,) = rep.compiled
    assert op.unknown_trip and op.count == 1


# ------------------------------------------------------------- SPMD705 beyond parameter shapes


def _single_device_sgd() -> Any:
    p, (x, y) = rp.dp_params(), rp.dp_batch()
    loss, g = jax.value_and_grad(rp.mlp_loss)(p, x, y)
    return jax.tree.map(lambda w, d: w - 0.1 * d, p, g), loss


def _param_bytes() -> int:
    return sum(int(v.size) * 4 for v in jax.tree.leaves(rp.dp_params()))


@pytest.mark.parametrize("which", list(rp.DP_STEPS))
def test_data_parallel_steps_compute_the_single_device_update(which: str) -> None:
    step, args = rp.dp_step(which)
    (new, loss), (want, want_loss) = step(*args), _single_device_sgd()
    for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=2e-5)


@pytest.mark.parametrize("which", ["tree", "flat"])
def test_gradients_reduced_once_per_step_are_not_flagged(which: str) -> None:
    rep = st.report(*_flat_made(rp.dp_step(which)))
    assert rep.summary() == rep.summary("compiled")
    grads = sum(c.bytes for c in rep.collectives if c.unit_bytes > 4)   # not the loss
    assert grads == _param_bytes()                   # exactly the ideal
    assert rep.flags == []


def test_gradients_pmeaned_again_after_autodiff_summed_them_are_flagged() -> None:
    rep = st.report(*_flat_made(rp.dp_step("tree_twice")))
    assert rep.summary() == rep.summary("compiled")
    volume = [f for f in rep.flags if f.code == "SPMD705"]
    assert len(volume) == 1 and volume[0].axes == ("dp",)
    assert "2.00x the ideal" in volume[0].message and "6 reductions" in volume[0].message
    assert volume[0].where == f"{rp.__file__}:{rp.line_of(rp._dp_tree_twice, 'SPMD705')}"
    assert "autodiff already sums" in volume[0].fix
    # the user's pmeans are the forward phase: only the gradient's origin makes them count
    assert {c.phase for c in rep.collectives if c.origin == "user"} == {"forward"}


def test_a_flattened_gradient_buffer_reduced_per_microbatch_is_flagged() -> None:
    rep = st.report(*_flat_made(rp.dp_step("flat_micro")))
    assert rep.summary() == rep.summary("compiled")
    (buf,) = [c for c in rep.collectives if c.unit_bytes > 4]
    shapes = {tuple(v.shape) for v in jax.tree.leaves(rp.dp_params())}
    assert tuple(buf.eqn.outvars[0].aval.shape) not in shapes   # one flat f32[n] buffer
    assert (buf.count, buf.unit_bytes) == (rp.MICRO, _param_bytes())
    (volume,) = [f for f in rep.flags if f.code == "SPMD705"]
    assert f"{rp.MICRO:.2f}x the ideal" in volume.message
    assert volume.where == f"{rp.__file__}:{rp.line_of(rp._dp_flat_micro, 'SPMD705')}"
    assert "once per step" in volume.fix


def _flat_made(made: tuple[Any, tuple[Any, ...]]) -> tuple[Any, ...]:
    return (made[0], *made[1])


# ------------------------------------------------------------- progress


class _Tty(__import__("io").StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_writes_each_phase_with_counts_to_stderr(capsys: pytest.CaptureFixture[str]
                                                          ) -> None:
    step, args = rp.accumulation("per_micro", concrete=True)
    quiet = st.report(step, *args)
    assert capsys.readouterr().err == ""               # off by default
    loud = st.report(step, *args, progress=True)
    err = capsys.readouterr().err
    assert loud.to_json() == quiet.to_json()
    lines = err.splitlines()
    assert [line.split("] ")[1].split(":")[0].split(" (")[0] for line in lines[:-1]] == \
        ["trace", "walk", "lower", "compile", "parse HLO", "match", "flags"]
    assert f"walk: {loud.equations} equations, 1 collectives" in err
    assert "parse HLO: 1 collectives" in err and "match: 0 added, 0 removed" in err
    assert f"flags: {len(loud.flags)} flags" in err and "lines of HLO" in err
    assert lines[-1].startswith("st.report: 1 collectives, 1 compiled in ")
    assert "\r" not in err                              # not a terminal: finished lines only
    st.report(step, *args, progress=False)
    st.report(step, *args, progress=None)               # None: only on a terminal
    assert capsys.readouterr().err == ""


def test_progress_on_a_terminal_by_default_and_without_compile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    step, args = rp.accumulation("per_micro")           # shapes only: nothing to compile
    tty = _Tty()
    monkeypatch.setattr("sys.stderr", tty)
    st.report(step, *args, compile=False, progress=None)
    err = tty.getvalue()
    assert "\r" in err and "trace ..." in err           # the running phase, overwritten
    assert "walk:" in err and "flags:" in err and "compile" not in err
