"""One engine (issue 27): on every program of the bug suite (tests/bugs/: buggy and fixed) and
of the porting suite (tests/porting/: the correct programs and their buggy variants), the
runtime's verdict equals `infer`'s report: the first violation infer lists is the error
`typed_shard_map` and `st.shard_map` raise (code and line), and a program infer accepts runs
under both. They call the same function (`_engine.check.check_shard_map`)."""

from __future__ import annotations

import importlib

import bugs
import jax
import pytest
from test_porting import BUGS as PORT_BUGS
from test_porting import PROGRAMS as PORT_PROGRAMS
from test_porting import load, program

import spmdtyped as st


def _verdict(run, args):
    try:
        jax.jit(run)(*args)
    except st.SpmdTypeError as e:
        return e.code, getattr(e, "line", None)
    return None


def _infer_verdict(body, args, mesh, in_specs, out_specs):
    rep = st.adapters.infer(body, *args, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    if rep.ok:
        return None
    v = rep.violations[0]
    return v.code, v.line


def _faces(body, mesh, in_specs, out_specs):
    yield "typed_shard_map", st.adapters.typed_shard_map(body, mesh=mesh, in_specs=in_specs,
                                                         out_specs=out_specs)
    yield "st.shard_map", st.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


BUG_CASES = [(n, v) for n in bugs.BUG_CLASSES for v in ("buggy_body", "fixed_body")]


@pytest.mark.parametrize("name,variant", BUG_CASES)
def test_bug_suite_parity(name, variant):
    m = importlib.import_module(f"bugs.{name}")
    body = getattr(m, variant)
    want = _infer_verdict(body, m.make_inputs(), m.mesh, m.IN_SPECS, m.OUT_SPECS)
    for face, run in _faces(body, m.mesh, m.IN_SPECS, m.OUT_SPECS):
        if want is None and face == "st.shard_map" and name == "custom_kernel_replicated_grad":
            continue  # its host callback would receive typed values (test_engine_raw_bugs)
        assert _verdict(run, m.make_inputs()) == want, (name, variant, face)


PORT_CASES = [(n, None) for n in PORT_PROGRAMS] + list(PORT_BUGS)


@pytest.mark.parametrize("name,bug", PORT_CASES)
def test_porting_suite_parity(name, bug, mesh_dp_tp):
    mod = load(name)
    body, in_specs, out_specs = program(mod, bug)
    args = mod.make_args(mesh_dp_tp)
    want = _infer_verdict(body, args, mesh_dp_tp, in_specs, out_specs)
    assert (want is None) == (bug is None)
    for face, run in _faces(body, mesh_dp_tp, in_specs, out_specs):
        if (name, bug, face) in KNOWN_GAPS:
            with pytest.raises(AssertionError):   # JAX's bare AssertionError (Q18) stands
                _verdict(run, args)
            continue
        assert _verdict(run, args) == want, (name, bug, face)


#: an unknown axis in a raw jax.lax collective: JAX raises a bare AssertionError while
#: tracing; typed_shard_map and infer re-trace with spmdtyped.lax routed (SPMD501), st.shard_map
#: cannot (the routing lives in adapters/, above it): left for the integrator
KNOWN_GAPS = {("ring_attention", "attention_bug_axis_typo", "st.shard_map")}


def test_checking_runs_the_engine_on_raw_shard_map_calls():
    """`st.adapters.checking(step)`: the `jax.shard_map` of the step is checked by the engine
    (the bias-before-psum bug, which no collective check sees); the step unwrapped is JAX's."""
    m = importlib.import_module("bugs.row_parallel_bias")
    path, line = bugs.bug_location(m)
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.checking(jax.jit(jax.shard_map(m.buggy_body, mesh=m.mesh, in_specs=m.IN_SPECS,
                                                   out_specs=m.OUT_SPECS)))(*m.make_inputs())
    assert (ei.value.code, ei.value.line) == ("SPMD210", line)
    jax.jit(jax.shard_map(m.buggy_body, mesh=m.mesh, in_specs=m.IN_SPECS,
                          out_specs=m.OUT_SPECS))(*m.make_inputs())   # unchecked again


def test_checking_names_an_unknown_axis(mesh_dp_tp):
    """An axis typo in a raw collective (jax 0.10: JAX's bare AssertionError) under
    `checking(step)` is SPMD501 at the collective's line, the closest mesh axis suggested."""
    mod = load("ring_attention")
    bug = "attention_bug_axis_typo"
    in_specs, out_specs = mod.BUGS[bug]
    step = jax.jit(jax.shard_map(getattr(mod, bug), mesh=mesh_dp_tp, in_specs=in_specs,
                                 out_specs=out_specs))
    with pytest.raises(st.SpmdTypeError) as ei:
        st.adapters.checking(step)(*mod.make_args(mesh_dp_tp))
    assert ei.value.code == "SPMD501", str(ei.value)
    assert "# BUG: SPMD501" in open(ei.value.file).read().splitlines()[ei.value.line - 1]

