"""The bug suite (tests/bugs/): every bug is real and every fix is right, on this JAX.

For each class: `fixed` equals the single-device `reference` (the forward value, or the
gradient for the autodiff classes) to `ATOL`/`RTOL`, and `buggy` does not: it is off by more
than `MIN_ERROR` (absolute, max over elements), or, where `JAX_REJECTS` names an exception,
JAX itself raises it. The typed rules that must catch each bug are specified in
docs/design/shard_partial.md.
"""

from __future__ import annotations

import importlib
import inspect
import pathlib

import bugs
import jax
import numpy as np
import pytest
from bugs._correct_programs import BODIES as CORRECT_BODIES
from bugs._correct_programs import PROGRAMS as CORRECT_PROGRAMS

import spmdtyped as st

ATOL = RTOL = 1e-5        # float32, tiny shapes: the fixed programs agree to ~1e-6
MIN_ERROR = 1e-2          # every buggy program is off by far more than rounding

HERE = pathlib.Path(__file__).parent / "bugs"
REAL_AXES = {"dp", "tp", "ep", "fsdp"}


def _module(name):
    return importlib.import_module(f"bugs.{name}")


def _max_error(got, want) -> float:
    got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
    assert len(got_leaves) == len(want_leaves)
    errs = []
    for g, w in zip(got_leaves, want_leaves, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype == np.float32
        errs.append(float(np.max(np.abs(g - w))))
    return max(errs)


def test_suite_lists_every_module_and_has_twelve_classes():
    files = {p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_")}
    assert files == set(bugs.BUG_CLASSES)
    assert len(bugs.BUG_CLASSES) >= 12


@pytest.mark.parametrize("name", bugs.BUG_CLASSES)
def test_interface_and_bug_line(name):
    m = _module(name)
    assert set(m.MESH_AXES) <= REAL_AXES
    assert int(np.prod(list(m.MESH_AXES.values()))) == 8 == m.mesh.size
    assert dict(m.mesh.shape) == m.MESH_AXES
    assert m.KIND in ("forward", "grad") and m.SOURCE and m.__doc__
    assert m.JAX_REJECTS is None or issubclass(m.JAX_REJECTS, Exception)
    for attr in ("make_inputs", "buggy", "fixed", "reference", "buggy_body", "fixed_body"):
        assert callable(getattr(m, attr)), attr
    path, line = bugs.bug_location(m)
    assert pathlib.Path(path).resolve() == (HERE / f"{name}.py").resolve()
    # The bug line lies in buggy_body itself, never in the fixed program.
    src, start = inspect.getsourcelines(m.buggy_body)
    assert start <= line < start + len(src)
    fsrc, fstart = inspect.getsourcelines(m.fixed_body)
    assert not fstart <= line < fstart + len(fsrc)


@pytest.mark.parametrize("name", bugs.BUG_CLASSES)
def test_fixed_matches_reference(name):
    m = _module(name)
    inputs = m.make_inputs()
    got, want = m.fixed(*inputs), m.reference(*inputs)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=RTOL, atol=ATOL)
    assert _max_error(got, want) <= ATOL + RTOL * max(
        float(np.max(np.abs(np.asarray(w)))) for w in jax.tree.leaves(want))


@pytest.mark.parametrize("name", bugs.BUG_CLASSES)
def test_buggy_is_wrong_or_rejected_by_jax(name):
    m = _module(name)
    inputs = m.make_inputs()
    if m.JAX_REJECTS is not None:
        with pytest.raises(m.JAX_REJECTS):
            jax.block_until_ready(m.buggy(*inputs))
        return
    err = _max_error(m.buggy(*inputs), m.reference(*inputs))
    assert err > MIN_ERROR, f"{name}: the buggy program is right (max error {err})"


@pytest.mark.parametrize("name", bugs.BUG_CLASSES)
def test_programs_are_deterministic(name):
    m = _module(name)
    a, b = m.make_inputs(), m.make_inputs()
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", sorted(CORRECT_PROGRAMS))
def test_false_positive_risk_programs_are_correct(name):
    """Correct programs the issue's rules would reject: they must stay accepted (or opt out)."""
    run, reference, make_inputs, _rule = CORRECT_PROGRAMS[name]
    inputs = make_inputs()
    got, want = run(*inputs), reference(*inputs)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- zero false positives
# What spmdtyped must keep accepting whatever rules issue 15 adds: every fixed program and every
# correct program above, walked by `infer` on its raw per-device body.


@pytest.mark.parametrize("name", bugs.BUG_CLASSES)
def test_infer_accepts_every_fixed_program(name):
    m = _module(name)
    rep = st.adapters.infer(m.fixed_body, *m.make_inputs(), mesh=m.mesh, in_specs=m.IN_SPECS,
                            out_specs=m.OUT_SPECS)
    assert rep.ok, [(v.code, getattr(v, "line", None)) for v in rep.violations]


@pytest.mark.parametrize("name", sorted(CORRECT_BODIES))
def test_infer_accepts_the_false_positive_risk_programs(name):
    body, mesh, in_specs, out_specs, make_inputs = CORRECT_BODIES[name]
    rep = st.adapters.infer(body, *make_inputs(), mesh=mesh, in_specs=in_specs,
                            out_specs=out_specs)
    assert rep.ok, [(v.code, getattr(v, "line", None)) for v in rep.violations]
