"""Production-pattern programs (`tests/production/`): Ulysses context parallelism with a
gathered-K/V variant, FSDP x expert parallelism with the gradient and its reduction in separate
shard_maps, and a ring expert-parallel MoE (`ragged_dot`, `check_vma=False`), written as raw
JAX on 2 x 2 x 2 meshes with explicit-sharding code around the shard_maps.

For every program: its loss and gradients equal a single-device reference; it runs unchanged
under `st.adapters.typed_shard_map` (the `jax.shard_map` name swapped, as `port` does) with
the same numbers; `st.adapters.infer` on each of its shard_maps reports no violation. For
every seeded one-line bug (`# BUG: SPMDxxx` on its line; `# REJECTED: SPMDxxx` on the body's
`def` where the program's outputs are what JAX rejects at its out_specs, a boundary error
reported at the body): the reference shows the bug is real (the numbers differ, or JAX
refuses it), and `infer` and `typed_shard_map` report the code at that line (for the
`check_vma=False` MoE: `infer`'s `check_vma_changes` and the drop-in's `CheckVmaWarning`,
the program running as `jax.shard_map`'s). The seeded bugs of the silent classes the engine
does not catch by default are strict xfails (`NOT_CAUGHT`). A typed twin (`st.shard_map`, specs
derived from hints) computes the same numbers.
"""

from __future__ import annotations

import pathlib
import re
import sys
import types
import warnings

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

import spmdtyped as st
from spmdtyped._errors import WRONG_EITHER_WAY

HERE = pathlib.Path(__file__).parent / "production"
#: one module per pattern (`*_typed.py`: a pattern's typed twin)
PATTERNS = sorted(p.stem for p in HERE.glob("*.py")
                  if not p.stem.startswith("_") and not p.stem.endswith("_typed"))
_COUNT = [0]
#: seeded bugs the engine does not report by default (the silent classes of issue 24 it cannot
#: tell from correct programs yet), as strict xfails: each one caught flips its test
NOT_CAUGHT: dict[tuple[str, str], str] = {
    ("ulysses", "psum_of_sharded"):
        "a psum of a value its in_spec shards over the axis: a spec cannot tell a slice of a "
        "global array from a stack of per-device terms (reported under strict=True only)",
}



def load(name: str, variant: str = "raw", calls: list | None = None) -> types.ModuleType:
    """A fresh copy of the pattern's module (no trace cache has seen its functions): as written,
    with `jax.shard_map` swapped for `typed_shard_map` ("typed"), or for a recorder of each
    shard_map's body, specs and abstract arguments ("record"). Line numbers are kept."""
    path = HERE / f"{name}.py"
    source = path.read_text()
    assert "jax.shard_map(" in source
    if variant == "typed":
        source = source.replace("jax.shard_map(", "st.adapters.typed_shard_map(")
    elif variant == "record":
        source = source.replace("jax.shard_map(", "_record_shard_map(")
    _COUNT[0] += 1
    module = types.ModuleType(f"production_{variant}_{name}_{_COUNT[0]}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    module.__dict__["st"] = st
    module.__dict__["_record_shard_map"] = _recorder(calls if calls is not None else [])
    exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    return module


def _recorder(calls: list) -> object:
    def shard_map(f, **kw):
        smapped = jax.shard_map(f, **kw)

        def call(*args):
            calls.append((f, kw, jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                              args)))
            return smapped(*args)
        return call
    return shard_map


def marker(mod: types.ModuleType, fn_name: str) -> tuple[str, int]:
    """(code, line) of the `# REJECTED: SPMDxxx` (else `# BUG: SPMDxxx`) comment in `fn_name`."""
    fn_name = getattr(mod, "MARKED_IN", {}).get(fn_name, fn_name)
    lines = pathlib.Path(mod.__file__).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"def {fn_name}\(", line))
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"(@|def |\S)", lines[i])),
               len(lines))
    for kind in ("REJECTED", "BUG"):
        for i in range(start, end):
            m = re.search(rf"# {kind}: (SPMD\d{{3}})", lines[i])
            if m:
                return m.group(1), i + 1
    raise AssertionError(f"{fn_name}: no # BUG marker")


_CACHE: dict[str, tuple] = {}


def setup(name: str, mod: types.ModuleType) -> tuple:
    """(mesh, placed params and batch, the reference's loss and gradients), once per pattern."""
    if name not in _CACHE:
        mesh = mod.make_mesh()
        params, batch = mod.make_params(jax.random.key(0)), mod.make_batch(jax.random.key(1))
        _CACHE[name] = (mesh, mod.place(mesh, params, batch), mod.reference(params, batch))
    return _CACHE[name]


def assert_close(got, want) -> None:
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                         rtol=2e-4, atol=2e-5), got, want)


def differs(got, want) -> bool:
    try:
        assert_close(got, want)
    except AssertionError:
        return True
    return False


ENTRIES = [(n, e) for n in PATTERNS for e in load(n).ENTRIES]
BUGS = [(n, b) for n in PATTERNS for b in load(n).BUGS]


def _bug_param(name: str, bug: str):
    reason = NOT_CAUGHT.get((name, bug))
    marks = [pytest.mark.xfail(strict=True, reason=f"not caught: {reason}")] if reason else []
    return pytest.param(name, bug, marks=marks, id=f"{name}-{bug}")


BUG_PARAMS = [_bug_param(n, b) for n, b in BUGS]


def test_suite_shape():
    assert len(PATTERNS) >= 3
    for name in PATTERNS:
        mod = load(name)
        assert len(mod.AXES) == 3 and all(size == 2 for _, size in mod.AXES)
        assert 2 <= len(mod.BUGS) <= 4
        for _stage, fn in mod.BUGS.values():
            marker(mod, fn)


@pytest.mark.parametrize("name,entry", ENTRIES)
def test_matches_single_device_reference(name, entry):
    mod = load(name)
    mesh, (params, batch), want = setup(name, mod)
    assert_close(mod.step(mesh, params, batch, **mod.entry_kwargs(getattr(mod, entry))), want)


@pytest.mark.parametrize("name,entry", ENTRIES)
def test_typed_shard_map_unchanged(name, entry):
    raw, typed = load(name), load(name, "typed")
    mesh, (params, batch), _ = setup(name, raw)
    with warnings.catch_warnings():  # a check_vma=False body too: no finding
        warnings.simplefilter("error", st.adapters.CheckVmaWarning)
        got = typed.step(mesh, params, batch, **typed.entry_kwargs(getattr(typed, entry)))
    want = raw.step(mesh, params, batch, **raw.entry_kwargs(getattr(raw, entry)))
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 got, want)


def _infer_stages(mesh, calls, *, strict: bool = False) -> list:
    reports = []
    with jax.set_mesh(mesh):
        for f, kw, args in calls:
            reports.append((f, st.adapters.infer(
                f, *args, mesh=kw["mesh"], in_specs=kw["in_specs"], out_specs=kw["out_specs"],
                check_vma=kw.get("check_vma", True), strict=strict)))
    return reports


@pytest.mark.parametrize("name,entry", ENTRIES)
def test_infer_reports_nothing(name, entry):
    calls: list = []
    mod = load(name, "record", calls)
    mesh, (params, batch), _ = setup(name, mod)
    mod.step(mesh, params, batch, **mod.entry_kwargs(getattr(mod, entry)))
    reports = _infer_stages(mesh, calls)
    assert len(reports) == mod.SHARD_MAPS  # a body and its reduction / loss: separate
    for f, rep in reports:
        assert rep.ok, (f.__name__, [str(v) for v in rep.violations])
        assert [m for m in rep.mismatches if not _argsort_of_varying(m)] == []


def _argsort_of_varying(mismatch: str) -> bool:
    """JAX (0.10.2 and 0.12.0.1) types `jnp.argsort`'s indices as its iota operand, Invariant,
    though they follow the varying keys (a replicated-typed value that differs per device:
    `out_specs=P()` accepts it and returns device 0's). The rule table says Varying; the
    walk records the difference as a mismatch, not a violation."""
    return ": sort: " in mismatch and mismatch.endswith(", Invariant")


def _buggy(mod, bug):
    stage, fn = mod.BUGS[bug]
    return {stage: getattr(mod, fn)}, fn


@pytest.mark.parametrize("name,bug", [(n, b) for n, b in BUGS])
def test_bug_is_real(name, bug):
    """The single-device reference shows each seeded bug: the numbers differ, or JAX rejects
    the program (a `# REJECTED` / out_specs bug)."""
    mod = load(name)
    mesh, (params, batch), want = setup(name, mod)
    kwargs, _ = _buggy(mod, bug)
    try:
        got = mod.step(mesh, params, batch, **kwargs)
    except Exception as e:  # noqa: BLE001 - JAX rejects it: the bug is real too
        assert "SpmdTypeError" not in type(e).__name__
        return
    assert differs(got, want), f"{name}.{bug}: the bug does not change the numbers"


@pytest.mark.parametrize("name,bug", BUG_PARAMS)
def test_infer_finds_bug(name, bug):
    calls: list = []
    mod = load(name, "record", calls)
    mesh, (params, batch), _ = setup(name, mod)
    kwargs, fn = _buggy(mod, bug)
    code, line = marker(mod, fn)
    try:
        mod.step(mesh, params, batch, **kwargs)
    except Exception:  # noqa: BLE001, S110 - JAX rejects it; its shard_map was recorded
        pass
    reports = [rep for f, rep in _infer_stages(mesh, calls) if f is kwargs[mod.BUGS[bug][0]]]
    assert reports, f"{name}.{bug}: the buggy stage did not run"
    first = reports[0].violations[0] if reports[0].violations else None
    assert first is not None, f"{name}.{bug}: no violation"
    assert (first.code, first.line, first.file) == (code, line, mod.__file__), str(first)
    if not getattr(mod, "CHECK_VMA", True):  # code written for check_vma=False: marked so
        # a Shard / Partial bug is wrong as the program runs, not only once the checks are on
        when = ("wrong with check_vma=False too" if code in WRONG_EITHER_WAY
                else "with check_vma=True")
        assert reports[0].check_vma_changes[0].startswith(f"{mod.__file__}:{line}: {code}: "
                                                          f"{when}")


@pytest.mark.parametrize("name,bug", BUG_PARAMS)
def test_typed_shard_map_finds_bug(name, bug):
    mod = load(name, "typed")
    mesh, (params, batch), _ = setup(name, mod)
    kwargs, fn = _buggy(mod, bug)
    code, line = marker(mod, fn)
    if getattr(mod, "CHECK_VMA", True):
        with pytest.raises(st.SpmdTypeError) as ei:
            mod.step(mesh, params, batch, **kwargs)
        assert (ei.value.code, ei.value.line) == (code, line), str(ei.value)
        return
    # check_vma=False: JAX's program runs as written (the same numbers as jax.shard_map's),
    # and what the checks would reject is a warning at the line
    with pytest.warns(st.adapters.CheckVmaWarning) as rec:
        got = mod.step(mesh, params, batch, **kwargs)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
                 got, load(name).step(mesh, params, batch, **kwargs))
    found = [w.message for w in rec if isinstance(w.message, st.adapters.CheckVmaWarning)]
    assert (found[0].code, found[0].line) == (code, line), str(found[0])
    assert str(found[0]).startswith("check_vma=False: ")


def test_strict_infer_reports_the_psum_of_a_sharded_value():
    """What the default cannot tell (NOT_CAUGHT: Ulysses' loss psum'd elementwise over the axes
    its in_specs shard, then averaged: n times the mean), `infer(..., strict=True)` reports at
    its line; the correct Ulysses step stays clean under strict=True."""
    for bug in (None, "psum_of_sharded"):
        calls: list = []
        mod = load("ulysses", "record", calls)
        mesh, (params, batch), _ = setup("ulysses", mod)
        kwargs = mod.entry_kwargs(mod.ulysses_block) if bug is None else _buggy(mod, bug)[0]
        mod.step(mesh, params, batch, **kwargs)
        reports = _infer_stages(mesh, calls, strict=True)
        found = [(v.code, v.line) for _f, rep in reports for v in rep.violations]
        if bug is None:
            assert found == [], found
        else:
            code, line = marker(mod, _buggy(mod, bug)[1])
            assert found == [(code, line)], found
            assert "strict=True" in str(reports[-1][1].violations[0])


def test_typed_twin_derives_the_specs_and_computes_the_same():
    """`ulysses_typed.block` under `st.shard_map` without specs: the spec trees come from its
    hints; its loss and gradients equal the raw program's reference."""
    from production import ulysses, ulysses_typed

    mod = load("ulysses")
    mesh, (params, batch), want = setup("ulysses", mod)

    (loss, y), grads = ulysses_typed.step(mesh, params, batch)
    assert_close((loss, grads), want)
    # the layouts derived are the raw program's hand-written ones
    assert y.sharding.spec == ulysses.ACT
    assert all(jax.tree.leaves(jax.tree.map(
        lambda g, s: g.sharding.is_equivalent_to(NamedSharding(mesh, s), g.ndim), grads,
        ulysses.PARAM_SPECS)))
