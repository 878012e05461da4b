"""The bug suite, typed (issue 15): the runtime refinement (Shard / Partial / Rep) catches each
bug class at its bug line, and the typed fixed program computes the single-device reference.

For every class of `bugs._typed.PORTS`: the typed buggy body, run through `st.shard_map` with
the raw module's specs, mesh and inputs, raises the port's code, and the traceback's innermost
user frame is the `# BUG(<class>)` line of the port; the typed fixed body runs and matches
`bugs.<class>.reference` to the suite's tolerance. Classes 9 (SPMD103, the four-state rule),
10 and 12 (st.cond / st.opaque compute them right) are covered by their own tests.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import bugs
import jax
import numpy as np
import pytest
from bugs import _typed

import spmdtyped as st
from spmdtyped import _errors
from spmdtyped._engine.walk import exception_source

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.lowering import normalize  # noqa: E402

ATOL = RTOL = 1e-5
#: classes whose check lives in st.grad (issue 15 item 5, the autodiff owner's part): attempted
#: here, skipped where this branch's st.grad does not provide it yet
AUTODIFF = {"expert_grads_wrong_group": "cotangent refinement", "per_example_grads_vmap": "SPMD407"}


def _module(name):
    return importlib.import_module(f"bugs.{name}")


def _smap(m, body):
    return jax.jit(st.shard_map(body, mesh=m.mesh, in_specs=m.IN_SPECS, out_specs=m.OUT_SPECS))


def _autodiff_ready(name: str) -> bool:
    if name == "per_example_grads_vmap":
        return "SPMD407" in _errors.REGISTRY
    if name == "expert_grads_wrong_group":
        m = _module(name)
        seen = {}

        def probe(w, x, y):   # the gradient of a Rep input: Partial when st.grad refines it
            g = st.grad(lambda w: (w * w).sum())(st.pcast(w, "dp", to="varying"))
            seen["ref"] = getattr(g, "refinement", None)
            return st.psum(g, "dp")

        _smap(m, probe).trace(*m.make_inputs())
        return seen["ref"] is not None and seen["ref"].get("dp") == "Partial"
    return True


def test_every_port_names_a_real_class_and_the_attempted_classes():
    assert set(_typed.PORTS) <= set(bugs.BUG_CLASSES)
    # 1-8, 11, 13, 14 (docs/design/shard_partial.md): 9 is four-state, 10 and 12 are rewrites
    assert set(bugs.BUG_CLASSES) - set(_typed.PORTS) == {
        "vocab_ce_doubled_reduction", "cond_axis_index_grad", "custom_kernel_replicated_grad"}


@pytest.mark.parametrize("name", sorted(_typed.PORTS))
def test_typed_buggy_program_raises_at_the_bug_line(name):
    if name in AUTODIFF and not _autodiff_ready(name):
        pytest.skip(f"st.grad on this branch lacks the {AUTODIFF[name]} (issue 15, autodiff part)")
    m, port = _module(name), _typed.PORTS[name]
    with pytest.raises(st.SpmdTypeError) as info:
        _smap(m, port.buggy)(*m.make_inputs())
    assert info.value.code == port.code, str(info.value)
    assert exception_source(info.value) == _typed.bug_line(name), str(info.value)
    assert "fix" in str(info.value)


@pytest.mark.parametrize("name", sorted(_typed.PORTS))
def test_typed_fixed_program_matches_the_reference(name):
    m, port = _module(name), _typed.PORTS[name]
    inputs = m.make_inputs()
    got, want = _smap(m, port.fixed)(*inputs), m.reference(*inputs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", sorted(_typed.PORTS))
def test_typed_programs_lower_like_the_raw_ones(name):
    """The refinement adds no operation: the typed fixed program lowers to the raw fixed one."""
    m, port = _module(name), _typed.PORTS[name]
    inputs = m.make_inputs()
    typed = _smap(m, port.fixed).lower(*inputs).as_text(debug_info=False)
    raw = jax.jit(jax.shard_map(m.fixed_body, mesh=m.mesh, in_specs=m.IN_SPECS,
                                out_specs=m.OUT_SPECS)).lower(*inputs).as_text(debug_info=False)
    if name in ("attention_sink_heads", "vocab_ce_missing_reduction", "layernorm_sharded_hidden"):
        # the typed port spells a step with other ops (take / one_hot / 1/sqrt): same numbers
        assert typed != "" and raw != ""
        return
    assert normalize(typed) == normalize(raw)


@pytest.mark.parametrize("name", sorted(_typed.CORRECT))
def test_correct_programs_typed(name):
    """The false-positive risks: accepted as written (or with `st.local`, which the port
    uses), and right (the pre-divided bias included: `b / st.axis_size("tp")` is a Partial
    term)."""
    from bugs._correct_programs import BODIES, PROGRAMS

    body, code = _typed.CORRECT[name]
    _raw_body, mesh, in_specs, out_specs, _ = BODIES[name]
    _run, reference, make_inputs, _rule = PROGRAMS[name]
    inputs = make_inputs()
    typed = jax.jit(st.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=out_specs))
    if name == "stacked_partials":   # the stack comes out of the raw first shard_map
        from bugs import _correct_programs as cp

        first = typed
        typed = jax.jit(lambda x: first(cp._partials(x)))
    if code is not None:
        with pytest.raises(st.SpmdTypeError) as info:
            typed(*inputs)
        assert info.value.code == code
        with st.allow(code):
            got = typed(*inputs)
    else:
        got = typed(*inputs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference(*inputs)), rtol=1e-4,
                               atol=1e-5)
