"""The porting suite, second part: ten raw shard_map programs written in the styles real code
uses (`tests/porting_styles/*.py`): `jax.set_mesh` + `@jax.shard_map(out_specs=...)` with
inferred in_specs, `jax.lax.X` call sites, `functools.partial` bodies, `jax.checkpoint`,
`check_vma=False` code, pytree arguments, collectives in `fori_loop` / `scan`, `@jax.jit`
helpers; axes dp, tp, fsdp, ep. JAX is the oracle.

For every program, with no edit of the program:
- `typed_shard_map` (the `jax.shard_map` name swapped for it, as `port` does) traces to the
  raw jaxpr and computes the raw results bit for bit;
- the drop-in for `jax.lax.X` call sites, `st.adapters.checking()`, traces to the raw jaxpr;
- `infer` reports no violation (for `check_vma=False` code: exactly what turning the checks on
  changes, the line marked `# VMA: SPMDxxx`);
- the codemod's output runs and traces to the raw jaxpr.
For every buggy variant (`# BUG: SPMDxxx`), `infer` and `typed_shard_map` report that code at
that line.
"""

from __future__ import annotations

import contextlib
import inspect
import pathlib
import re
import sys
import types
import warnings

import jax
import numpy as np
import pytest

import spmdtyped as st
from spmdtyped.adapters._port import codemod as _codemod

HERE = pathlib.Path(__file__).parent / "porting_styles"
PROGRAMS = sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))
_COUNT = [0]


def load(name: str, variant: str = "raw", tmp: pathlib.Path | None = None) -> types.ModuleType:
    """A fresh module object (fresh functions: no JAX trace cache has seen them): as written,
    with `jax.shard_map` swapped for `typed_shard_map` ("typed"), or as the codemod ports it."""
    path = HERE / f"{name}.py"
    source = path.read_text()
    if variant == "typed":
        assert "jax.shard_map(" in source
        source = "import spmdtyped as st\n" + source.replace(
            "jax.shard_map(", "st.adapters.typed_shard_map(")
    elif variant == "port":
        source, changes = _codemod.port_source(source)
        assert changes
        assert tmp is not None
        path = tmp / f"ported_{name}.py"
        path.write_text(source)
    _COUNT[0] += 1
    module = types.ModuleType(f"styles_{variant}_{name}_{_COUNT[0]}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    first = 1 if variant == "typed" else 0  # keep line numbers: compile with an offset
    code = compile(source if not first else source.split("\n", 1)[1], str(path), "exec",
                   dont_inherit=True)
    if first:
        exec("import spmdtyped as st", module.__dict__)  # noqa: S102
    exec(code, module.__dict__)  # noqa: S102
    return module


@pytest.fixture(scope="module")
def meshes():
    cache: dict[tuple, jax.sharding.Mesh] = {}

    def get(mod: types.ModuleType) -> jax.sharding.Mesh:
        key = mod.AXES
        if key not in cache:
            cache[key] = jax.make_mesh(tuple(s for _, s in key), tuple(n for n, _ in key))
        return cache[key]

    return get


@pytest.fixture(scope="module")
def ported_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ported_styles")


def _mesh_context(mod, mesh):
    return jax.set_mesh(mesh) if getattr(mod, "SET_MESH", False) else contextlib.nullcontext()


def _run(mod, mesh, fn_name, args):
    with _mesh_context(mod, mesh):
        return mod.run(mesh, getattr(mod, fn_name), *args)


def _jaxpr(mod, mesh, fn_name, args) -> str:
    """The program that is compiled: the lowered text, without the names JAX gives arguments
    and results."""
    import re

    with _mesh_context(mod, mesh):
        text = jax.jit(lambda *a: mod.run(mesh, getattr(mod, fn_name), *a)).lower(*args).as_text()
    return re.sub(r'jax\.(result|arg)_info = "[^"]*",? ?', "", text)


def assert_same(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert str(ta) == str(tb)  # the same structure (NamedTuple classes of two module copies)
    for x, y in zip(la, lb, strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def marker(mod, fn_name: str, kind: str = "BUG") -> tuple[str, int] | None:
    """(code, line) of the `# BUG: SPMDxxx` comment in function `fn_name` (or the helper
    `BUG_LINES` names); `# REJECTED: SPMDxxx` marks where JAX rejects a buggy program, which
    the raw tools report (JAX's error translated; `# BUG` is the cause, which typed code and
    mypy see)."""
    fn_name = getattr(mod, "BUG_LINES", {}).get(fn_name, fn_name)
    lines = pathlib.Path(mod.__file__).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"\s*def {fn_name}\(", line))
    for i in range(start, len(lines)):
        m = re.search(rf"# {kind}: (SPMD\d{{3}})", lines[i])
        if m:
            return m.group(1), i + 1
        if i > start and re.match(r"(@|def )", lines[i]):
            break
    return None


def _target(mod, fn_name):
    fn = inspect.unwrap(getattr(mod, fn_name))
    return getattr(mod, "body", lambda f: f)(fn)


HANDLED: dict[str, set[str]] = {"typed_shard_map": set(), "lax": set(), "infer": set(),
                                "port": set()}


@pytest.mark.parametrize("name", PROGRAMS)
def test_typed_shard_map_unchanged(name, meshes):
    raw, typed = load(name), load(name, "typed")
    mesh = meshes(raw)
    args, targs = raw.make_args(mesh), typed.make_args(mesh)  # pytrees of each module's classes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", st.adapters.CheckVmaWarning)
        assert _jaxpr(typed, mesh, raw.ENTRY, targs) == _jaxpr(raw, mesh, raw.ENTRY, args)
        assert_same(_run(typed, mesh, raw.ENTRY, targs), _run(raw, mesh, raw.ENTRY, args))
    # check_vma=False code: its body analysed as if the checks were on, the line whose meaning
    # they change warned (`# VMA: SPMDxxx`); nothing for the others
    found = {(w.message.code, w.message.line) for w in caught
             if isinstance(w.message, st.adapters.CheckVmaWarning)}
    vma = marker(raw, raw.ENTRY, "VMA")
    assert found == ({vma} if vma else set())
    HANDLED["typed_shard_map"].add(name)


@pytest.mark.parametrize("name", PROGRAMS)
def test_checking_dropin_unchanged(name, meshes):
    """`st.adapters.checking(step)` of each program, unedited: accepted, the same numbers."""
    raw = load(name)
    mesh = meshes(raw)
    args = raw.make_args(mesh)
    with _mesh_context(raw, mesh):
        got = st.adapters.checking(lambda *a: raw.run(mesh, getattr(raw, raw.ENTRY), *a))(*args)
    assert_same(got, _run(raw, mesh, raw.ENTRY, args))
    HANDLED["lax"].add(name)


@pytest.mark.parametrize("name", PROGRAMS)
def test_infer_unchanged(name, meshes):
    mod = load(name)
    mesh = meshes(mod)
    rep = st.adapters.infer(_target(mod, mod.ENTRY), *mod.make_args(mesh), mesh=mesh,
                            in_specs=mod.IN_SPECS, out_specs=mod.OUT_SPECS)
    vma = marker(mod, mod.ENTRY, "VMA")
    if vma is None:
        assert rep.ok, [str(v) for v in rep.violations]
        assert rep.mismatches == []
    else:
        # check_vma=False code: infer reports what turning the checks on changes
        assert [(v.code, v.line) for v in rep.violations] == [vma]
        rep = st.adapters.infer(_target(mod, mod.ENTRY), *mod.make_args(mesh), mesh=mesh,
                                in_specs=mod.IN_SPECS, out_specs=mod.OUT_SPECS, check_vma=False)
        assert len(rep.check_vma_changes) == 1
        assert rep.check_vma_changes[0].startswith(f"{mod.__file__}:{vma[1]}: {vma[0]}: with check_vma=True")
        assert "turning check_vma on changes:" in str(rep)
    HANDLED["infer"].add(name)


@pytest.mark.parametrize("name", PROGRAMS)
def test_port_unchanged(name, meshes, ported_dir):
    raw, ported = load(name), load(name, "port", ported_dir)
    mesh = meshes(raw)
    args, pargs = raw.make_args(mesh), ported.make_args(mesh)
    assert _jaxpr(ported, mesh, raw.ENTRY, pargs) == _jaxpr(raw, mesh, raw.ENTRY, args)
    assert_same(_run(ported, mesh, raw.ENTRY, pargs), _run(raw, mesh, raw.ENTRY, args))
    HANDLED["port"].add(name)


BUGS = [(name, bug) for name in PROGRAMS for bug in load(name).BUGS]


def test_suite_size():
    assert len(PROGRAMS) >= 10 and len(BUGS) >= 10
    assert all(marker(load(n), b) is not None for n, b in BUGS)


@pytest.mark.parametrize("name,bug", BUGS)
def test_infer_finds_bug(name, bug, meshes):
    mod = load(name)
    mesh = meshes(mod)
    code, line = marker(mod, bug, "REJECTED") or marker(mod, bug)
    rep = st.adapters.infer(_target(mod, bug), *mod.make_args(mesh), mesh=mesh,
                            in_specs=mod.IN_SPECS, out_specs=mod.OUT_SPECS)
    assert rep.violations, f"{name}.{bug}: no violation"
    first = rep.violations[0]
    assert (first.code, first.line, first.file) == (code, line, mod.__file__), str(first)


@pytest.mark.parametrize("name,bug", BUGS)
def test_typed_shard_map_finds_bug(name, bug, meshes):
    mod = load(name, "typed")
    mesh = meshes(mod)
    code, line = marker(mod, bug, "REJECTED") or marker(mod, bug)
    with pytest.raises(st.SpmdTypeError) as ei:
        _run(mod, mesh, bug, mod.make_args(mesh))
    assert (ei.value.code, ei.value.line) == (code, line), str(ei.value)


def test_counts(meshes, ported_dir, capsys):
    """Programs each tool handles unchanged (the tests above record theirs; the rest run
    here) and bugs found."""
    tests = {"typed_shard_map": test_typed_shard_map_unchanged, "lax": test_checking_dropin_unchanged,
             "infer": test_infer_unchanged, "port": test_port_unchanged}
    for tool, fn in tests.items():
        for name in set(PROGRAMS) - HANDLED[tool]:
            kwargs = {"name": name, "meshes": meshes}
            if tool == "port":
                kwargs["ported_dir"] = ported_dir
            try:
                fn(**kwargs)
            except Exception:  # noqa: BLE001, S110 - counted as not handled
                pass
    counts = {tool: len(done) for tool, done in HANDLED.items()}
    with capsys.disabled():
        print(f"\nporting styles: {len(PROGRAMS)} programs, {len(BUGS)} bugs; handled "
              f"unchanged: {counts}")
    assert counts == {tool: len(PROGRAMS) for tool in HANDLED}


def test_ported_programs_pass_mypy_with_the_plugin(tmp_path):
    """The codemod's output for the ten programs (correct and buggy variants), checked with
    `python -m spmdtyped check`: no error. (The bugs are not among mypy's findings: the
    codemod emits `st.lax.X` collectives on raw values, which mypy types as Any.)"""
    pytest.importorskip("mypy")
    import os
    import subprocess

    root = pathlib.Path(__file__).resolve().parent.parent
    for name in PROGRAMS:
        source = _codemod.port_source((HERE / f"{name}.py").read_text())[0]
        (tmp_path / f"ported_{name}.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "spmdtyped", "check", ".", "--cache-dir",
                           str(tmp_path / "cache")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"no issues found in {len(PROGRAMS)} source files" in proc.stdout
