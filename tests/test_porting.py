"""The porting suite: ten raw shard_map programs (tests/porting/*.py), each ported with the four
tools, with JAX itself as the oracle.

For every program: the `spmdtyped.lax` drop-in (a one-line import change), `typed_shard_map`
and the codemod's output all compute exactly what the raw program computes; `infer` reports
no violation and the states JAX computes (`jax.typeof(...).manual_axis_type`) for every
argument and output. For every buggy variant (marked `# BUG: SPMDxxx` in the program), the
tools report that code at that line; the variants JAX accepts are run under JAX too.
"""

from __future__ import annotations

import pathlib
import re
import sys
import types
from typing import Any

import jax
import numpy as np
import pytest

import spmdtyped as st
from spmdtyped import _compat
from spmdtyped.adapters._port import codemod as _codemod

HERE = pathlib.Path(__file__).parent / "porting"
PROGRAMS = sorted(p.stem for p in HERE.glob("*.py") if not p.stem.startswith("_"))
#: the strict codes: JAX accepts these programs (and computes something wrong)
STRICT = ("SPMD103", "SPMD202")
#: strict bugs jax 0.12.1 rejects itself (`Feature.NO_RULE_REJECTS`)
JAX_0_12_1_REJECTS = {"step_bug_cumsum_unreduced"}
#: codes the lax drop-in can raise by itself (the rest need the jaxpr walk or the boundary)
LAX_CODES = ("SPMD101", "SPMD102", "SPMD103", "SPMD104", "SPMD301", "SPMD501")

_MODULES: dict[tuple[str, str], types.ModuleType] = {}


def load(name: str, variant: str = "raw", tmp: pathlib.Path | None = None) -> types.ModuleType:
    """A program module: as written ("raw"), with the one-line lax import change ("lax"),
    or as the codemod ports it ("port")."""
    key = (name, variant)
    if key in _MODULES:
        return _MODULES[key]
    path = HERE / f"{name}.py"
    source = path.read_text()
    if variant == "lax":
        assert source.count("from jax import lax\n") == 1
        source = source.replace("from jax import lax\n", "import spmdtyped.lax as lax\n")
    elif variant == "port":
        source, changes = _codemod.port_source(source)
        assert changes, f"the codemod changed nothing in {name}"
        assert tmp is not None
        path = tmp / f"ported_{name}.py"
        path.write_text(source)
    module = types.ModuleType(f"porting_{variant}_{name}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module
    exec(compile(source, str(path), "exec", dont_inherit=True), module.__dict__)  # noqa: S102
    _MODULES[key] = module
    return module


@pytest.fixture(scope="module")
def ported_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ported")


_RAW: dict[str, object] = {}
_RAW_JAXPR: dict[str, str] = {}


def raw_jaxpr(name, mesh):
    """The raw program's jaxpr text: the ported programs must trace to exactly this."""
    if name not in _RAW_JAXPR:
        mod = load(name)
        _RAW_JAXPR[name] = str(jax.make_jaxpr(mod.build(mesh))(*mod.make_args(mesh)))
    return _RAW_JAXPR[name]


def raw_lowered(fn, args) -> str:
    """The lowered (StableHLO) text of `fn` on `args`: the program that is compiled (the
    names JAX gives the results and arguments left out: a port may nest its outputs)."""
    text = jax.jit(fn).lower(*args).as_text()
    return re.sub(r'jax\.(result|arg)_info = "[^"]*",? ?', "", text)


def raw_result(name, mesh):
    if name not in _RAW:
        mod = load(name)
        _RAW[name] = mod.build(mesh)(*mod.make_args(mesh))
    return _RAW[name]


def assert_same(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb, strict=True):
        assert x.shape == y.shape and x.dtype == y.dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def bug_marker(module: types.ModuleType, fn_name: str) -> tuple[str, int]:
    """(code, line) of the `# BUG: SPMDxxx` comment inside function `fn_name` of the module."""
    lines = pathlib.Path(module.__file__).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"def {fn_name}("))
    for i in range(start, len(lines)):
        m = re.search(r"# BUG: (SPMD\d{3})", lines[i])
        if m:
            return m.group(1), i + 1
        if i > start and lines[i].startswith("def "):
            break
    raise AssertionError(f"no BUG marker in {fn_name}")


BUGS = [(name, bug) for name in PROGRAMS for bug in load(name).BUGS]


def program(mod: types.ModuleType, bug: str | None) -> tuple[Any, Any, Any]:
    """`(body, in_specs, out_specs)` of a porting program: its main function (`bug` None) or
    its buggy variant `bug`."""
    if bug is None:
        return getattr(mod, mod.MAIN), mod.IN_SPECS, mod.OUT_SPECS
    return (getattr(mod, bug), *mod.BUGS[bug])


def test_suite_size():
    assert len(PROGRAMS) >= 10
    assert len(BUGS) >= 8
    strict = [b for b in BUGS if bug_marker(load(b[0]), b[1])[0] in STRICT]
    assert len(strict) >= 5


# ------------------------------------------------------------------- correct programs


@pytest.mark.parametrize("name", PROGRAMS)
def test_lax_dropin_identical(name, mesh_dp_tp):
    mod = load(name, "lax")
    assert mod.lax is st.lax
    # the same program: identical jaxpr (hence identical results; typed_shard_map's test
    # also compares numbers)
    assert str(jax.make_jaxpr(mod.build(mesh_dp_tp))(*mod.make_args(mesh_dp_tp))) == raw_jaxpr(name, mesh_dp_tp)
    HANDLED["lax"].add(name)


@pytest.mark.parametrize("name", PROGRAMS)
def test_typed_shard_map_identical(name, mesh_dp_tp):
    mod = load(name)
    fn = st.adapters.typed_shard_map(getattr(mod, mod.MAIN), mesh=mesh_dp_tp, in_specs=mod.IN_SPECS,
                                     out_specs=mod.OUT_SPECS)
    args = mod.make_args(mesh_dp_tp)
    # the compiled program is the raw one (a jax.grad in the body leaves the engine's
    # identity marker in the jaxpr, which lowers to nothing: compare the lowered programs)
    assert raw_lowered(fn, args) == raw_lowered(mod.build(mesh_dp_tp), args)
    assert_same(fn(*args), raw_result(name, mesh_dp_tp))
    HANDLED["typed_shard_map"].add(name)


def _jax_states(mod, mesh):
    """The states JAX gives the arguments and outputs of the raw per-shard function."""
    seen = {}
    f = getattr(mod, mod.MAIN)

    def probe(*args):
        seen["in"] = [jax.typeof(a).manual_axis_type for a in jax.tree_util.tree_leaves(args)]
        out = f(*args)
        seen["out"] = [jax.typeof(o).manual_axis_type for o in jax.tree_util.tree_leaves(out)]
        return out

    jax.shard_map(probe, mesh=mesh, in_specs=mod.IN_SPECS, out_specs=mod.OUT_SPECS)(
        *mod.make_args(mesh))
    return seen["in"], seen["out"]


def _same_state(t: st.SpmdType, mat) -> bool:
    return (t.varying, t.unreduced, t.reduced) == (mat.varying, mat.unreduced, mat.reduced)


@pytest.mark.parametrize("name", PROGRAMS)
def test_infer_matches_jax(name, mesh_dp_tp):
    mod = load(name)
    rep = st.adapters.infer(getattr(mod, mod.MAIN), *mod.make_args(mesh_dp_tp), mesh=mesh_dp_tp,
                            in_specs=mod.IN_SPECS, out_specs=mod.OUT_SPECS)
    assert rep.ok, [str(v) for v in rep.violations]
    assert rep.mismatches == []
    jin, jout = _jax_states(mod, mesh_dp_tp)
    assert len(rep.in_types) == len(jin) and len(rep.out_types) == len(jout)
    assert all(_same_state(t, m) for t, m in zip(rep.in_types, jin, strict=True)), (rep.in_types, jin)
    assert all(_same_state(t, m) for t, m in zip(rep.out_types, jout, strict=True)), (rep.out_types, jout)
    assert rep.signature.startswith(f"def {mod.MAIN}(") and rep.signature.endswith(":")
    # the rule table was consulted for the equations: collectives and arithmetic
    prims = {s.primitive for s in rep.steps}
    assert prims & set(st._surface.AXIS_PRIMITIVES) and prims & set(st._rules.PRIMITIVES)
    HANDLED["infer"].add(name)


@pytest.mark.parametrize("name", PROGRAMS)
def test_infer_accepts_shape_dtype_structs(name, mesh_dp_tp):
    mod = load(name)
    sds = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in mod.make_args(mesh_dp_tp)]
    rep = st.adapters.infer(getattr(mod, mod.MAIN), *sds, mesh=mesh_dp_tp, in_specs=mod.IN_SPECS,
                            out_specs=mod.OUT_SPECS)
    assert rep.ok


@pytest.mark.parametrize("name", PROGRAMS)
def test_port_identical_and_annotated(name, mesh_dp_tp, ported_dir):
    mod = load(name, "port", ported_dir)
    source = pathlib.Path(mod.__file__).read_text()
    assert "jax.shard_map(" not in source and "from jax import lax" not in source
    assert "from spmdtyped import lax" in source
    args = mod.make_args(mesh_dp_tp)
    assert raw_lowered(mod.build(mesh_dp_tp), args) == raw_lowered(load(name).build(mesh_dp_tp), args)
    # the annotations the codemod wrote equal the signature infer computes
    raw = load(name)
    rep = st.adapters.infer(getattr(raw, raw.MAIN), *raw.make_args(mesh_dp_tp), mesh=mesh_dp_tp,
                            in_specs=raw.IN_SPECS, out_specs=raw.OUT_SPECS)
    assert rep.signature in source.splitlines()
    # and the annotations are the runtime hint objects: they evaluate
    fn = getattr(mod, mod.MAIN)
    assert all(isinstance(h, type) or hasattr(h, "__origin__")
               for h in fn.__annotations__.values()), fn.__annotations__
    HANDLED["port"].add(name)


# ------------------------------------------------------------------- buggy variants


@pytest.mark.parametrize("name,bug", BUGS)
def test_infer_reports_bug(name, bug, mesh_dp_tp):
    mod = load(name)
    code, line = bug_marker(mod, bug)
    in_specs, out_specs = mod.BUGS[bug]
    rep = st.adapters.infer(getattr(mod, bug), *mod.make_args(mesh_dp_tp), mesh=mesh_dp_tp,
                            in_specs=in_specs, out_specs=out_specs)
    assert not rep.ok
    first = rep.violations[0]
    assert (first.code, first.line) == (code, line), str(first)
    assert first.file == mod.__file__ and first.source == f"{mod.__file__}:{line}"
    assert isinstance(first, st.SpmdTypeError)


@pytest.mark.parametrize("name,bug", BUGS)
def test_typed_shard_map_reports_bug(name, bug, mesh_dp_tp):
    mod = load(name)
    code, line = bug_marker(mod, bug)
    in_specs, out_specs = mod.BUGS[bug]
    fn = st.adapters.typed_shard_map(getattr(mod, bug), mesh=mesh_dp_tp, in_specs=in_specs,
                                     out_specs=out_specs)
    with pytest.raises(st.SpmdTypeError) as ei:
        fn(*mod.make_args(mesh_dp_tp))
    assert (ei.value.code, ei.value.line) == (code, line), str(ei.value)


@pytest.mark.parametrize("name,bug", [b for b in BUGS if bug_marker(load(b[0]), b[1])[0] in LAX_CODES])
def test_lax_dropin_reports_bug(name, bug, mesh_dp_tp):
    """The collective bugs; SPMD202 (a non-linear op) and SPMD401 (out_specs) need the jaxpr
    walk or the boundary check of typed_shard_map/infer."""
    mod = load(name, "lax")
    code, line = bug_marker(mod, bug)
    in_specs, out_specs = mod.BUGS[bug]
    with pytest.raises(st.SpmdTypeError) as ei:
        jax.shard_map(getattr(mod, bug), mesh=mesh_dp_tp, in_specs=in_specs, out_specs=out_specs)(
            *mod.make_args(mesh_dp_tp))
    assert ei.value.code == code
    tb = [f for f in __import__("traceback").extract_tb(ei.value.__traceback__)
          if f.filename == mod.__file__]
    assert tb and tb[-1].lineno == line


@pytest.mark.parametrize("name,bug", [b for b in BUGS if bug_marker(load(b[0]), b[1])[0] in STRICT])
def test_jax_accepts_strict_bugs(name, bug, mesh_dp_tp):
    """These are the silent bugs: JAX traces (type-checks) them without complaint (jax 0.12.1
    rejects the ones through a primitive without an unreduced rule)."""
    mod = load(name)
    in_specs, out_specs = mod.BUGS[bug]
    if _compat.FEATURES.no_rule_rejects and bug in JAX_0_12_1_REJECTS:
        with pytest.raises(NotImplementedError, match="unreduced/reduced rule"):
            jax.make_jaxpr(jax.shard_map(getattr(mod, bug), mesh=mesh_dp_tp, in_specs=in_specs,
                                         out_specs=out_specs))(*mod.make_args(mesh_dp_tp))
        return
    jax.make_jaxpr(jax.shard_map(getattr(mod, bug), mesh=mesh_dp_tp, in_specs=in_specs,
                                 out_specs=out_specs))(*mod.make_args(mesh_dp_tp))


def test_pmean_of_summed_gradients_is_wrong_by_the_axis_size(mesh_dp_tp):
    mod = load("dp_step")
    args = mod.make_args(mesh_dp_tp)
    good = mod.build(mesh_dp_tp)(*args)
    bad = jax.shard_map(mod.step_bug_pmean_grads, mesh=mesh_dp_tp, in_specs=mod.IN_SPECS,
                        out_specs=mod.OUT_SPECS)(*args)
    # JAX already summed the gradients of the replicated w over dp; pmean keeps the sum
    np.testing.assert_allclose(np.asarray(args[0] - bad[0]), 2 * np.asarray(args[0] - good[0]),
                               rtol=1e-5, atol=1e-6)


#: tool -> programs it handled unchanged (filled by the tests above)
HANDLED: dict[str, set[str]] = {"lax": set(), "typed_shard_map": set(), "infer": set(),
                                "port": set()}
_PER_TOOL = {"lax": "test_lax_dropin_identical", "typed_shard_map": "test_typed_shard_map_identical",
             "infer": "test_infer_matches_jax", "port": "test_port_identical_and_annotated"}


def test_counts_of_programs_handled_unchanged(mesh_dp_tp, ported_dir, capsys):
    """How many suite programs each tool handles with no edit beyond the tool's own (the
    tests above record their successes; missing entries are run here)."""
    for tool, test in _PER_TOOL.items():
        for name in set(PROGRAMS) - HANDLED[tool]:
            fn = globals()[test]
            kwargs = {"name": name, "mesh_dp_tp": mesh_dp_tp}
            if tool == "port":
                kwargs["ported_dir"] = ported_dir
            try:
                fn(**kwargs)
            except Exception:  # noqa: BLE001, S110 - counted as not handled
                pass
    counts = {tool: len(done) for tool, done in HANDLED.items()}
    with capsys.disabled():
        print(f"\nporting suite: {len(PROGRAMS)} programs; handled unchanged per tool: {counts}")
    assert counts == {tool: len(PROGRAMS) for tool in HANDLED}


def test_ported_programs_pass_mypy_with_the_plugin(tmp_path):
    """The codemod's output, checked by mypy with spmdtyped's plugin (one run, ~30 s cold):
    all ten programs. The codemod rewrites the `jnp` / `jax.nn` calls of the ported functions
    to `st.numpy` / `st.nn` (megatron_mlp: `jax.nn.gelu(x @ w1 + b1)` takes an annotated value;
    moe: `jnp.sum` returns into an annotated result), which jax's stubs would reject."""
    pytest.importorskip("mypy")
    import os
    import subprocess

    root = pathlib.Path(__file__).resolve().parent.parent
    # a control file with a mistake only the plugin sees: proves that mypy ran with the plugin
    control = tmp_path / "control_mistake.py"
    control.write_text("import spmdtyped as st\nfrom spmdtyped import Reduced\n\n\n"
                       "def f(w: Reduced['dp']) -> None:\n    st.psum(w, 'dp')\n")
    files = [str(control)]
    for name in PROGRAMS:
        path = tmp_path / f"ported_{name}.py"
        path.write_text(_codemod.port_source((HERE / f"{name}.py").read_text())[0])
        files.append(str(path))
    (tmp_path / "mypy.ini").write_text(
        f"[mypy]\nplugins = spmdtyped.mypy_plugin\ncache_dir = {tmp_path / 'cache'}\n"
        "[mypy-spmdtyped.*]\nfollow_imports = silent\n")
    env = {**os.environ, "MYPYPATH": str(root),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(tmp_path / "mypy.ini"),
                          "--no-error-summary", *files], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=600).stdout
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert [line for line in errors if line.startswith("control_mistake.py:6:")], out
    assert [line for line in out.splitlines()
            if line.startswith("control_mistake.py:6:") and "SPMD101" in line], out
    failing = {pathlib.Path(line.split(":")[0]).stem.removeprefix("ported_")
               for line in errors} - {"control_mistake"}
    assert not failing, out
    assert len(files) - 1 == len(PROGRAMS) >= 10
