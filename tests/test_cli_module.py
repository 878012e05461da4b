"""`infer FILE[:FUNC]` and `port FILE` read the module: its `jax.shard_map` calls (decorators,
`partial(jax.shard_map, ...)`, assignments, `functools.partial` bodies, `jax.set_mesh` and
`with jax.set_mesh(...)`) give the mesh and the specs, module-level arrays passed to the
shard_map'd function give the shapes; no flags. Exit codes: 0 clean, 1 violations, 2 usage or
crash. A module that calls `jax.set_mesh` globally runs in a subprocess (its mesh would stay set
for the tests after it)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

from spmdtyped._cli import infer as _infer_cli
from spmdtyped._cli import port as _port_cli

ROOT = pathlib.Path(__file__).resolve().parent.parent

GLOBAL_SET_MESH = '''
import functools
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 4), ("dp", "tp"))
jax.set_mesh(mesh)
x = jax.device_put(jnp.arange(256.0).reshape(8, 32) / 256, NamedSharding(mesh, P("dp", "tp")))
w = jax.device_put(jnp.ones((32, 4)) / 32, NamedSharding(mesh, P("tp", None)))


@jax.shard_map(in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp"))
def layer(x, w):
    return jax.lax.psum(jnp.tanh(x) @ w, "tp")


@partial(jax.shard_map, in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp"))
def layer_twice(x, w):
    y = jax.lax.psum(x @ w, "tp")
    return jax.lax.psum(y, "tp")  # BUG: SPMD103


def _scaled(x, w, scale):
    return jax.lax.psum(x @ w, "tp") * scale


scaled = jax.shard_map(functools.partial(_scaled, scale=2.0), mesh=mesh,
                       in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp"))

def twice():  # the shapes of layer_twice's arguments (the bug raises once ported)
    return layer_twice(x, w)


if __name__ == "__main__":
    print([float(v.sum()) for v in (layer(x, w), scaled(x, w))])
'''

DRIVER = '''
import json, sys
from spmdtyped._cli import infer, port
path = sys.argv[1]
rcs = {
    "all": infer.main([path]),
    "layer": infer.main([path + ":layer"]),
    "scaled": infer.main([path + ":scaled"]),
    "twice": infer.main([path + ":layer_twice"]),
    "mesh_flag": infer.main([path + ":layer", "--mesh", "dp=4,tp=2"]),
    "no_such": infer.main([path + ":nothing_here"]),
    "port": port.main([path, "--write"]),
}
print("RCS=" + json.dumps(rcs))
'''


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"  # `python FILE` needs them
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def _run(*argv: str, cwd: pathlib.Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=900)


def _mypy(files: list[pathlib.Path], cwd: pathlib.Path) -> str:
    (cwd / "mypy.ini").write_text(
        f"[mypy]\nplugins = spmdtyped.mypy_plugin\ncache_dir = {cwd / 'cache'}\n"
        "[mypy-spmdtyped.*]\nfollow_imports = silent\n")
    env = {**_env(), "MYPYPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(cwd / "mypy.ini"),
                           "--no-error-summary", "--show-error-codes", *map(str, files)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600).stdout


@pytest.fixture(scope="module")
def global_mesh_run(tmp_path_factory):
    """The set_mesh module: `infer` on it with no flags (every body, each by name, `--mesh`),
    then `port --write`; its numbers before and after the port; mypy on the port."""
    pytest.importorskip("libcst")
    d = tmp_path_factory.mktemp("setmesh")
    path = d / "setmesh_prog.py"
    path.write_text(GLOBAL_SET_MESH)
    before = _run(str(path), cwd=d)
    assert before.returncode == 0, before.stderr
    (d / "driver.py").write_text(DRIVER)
    proc = _run(str(d / "driver.py"), str(path), cwd=d)
    m = re.search(r"RCS=(\{.*\})", proc.stdout)
    assert m, proc.stdout + proc.stderr
    after = _run(str(path), cwd=d)
    return {"rcs": json.loads(m.group(1)), "out": proc.stdout, "err": proc.stderr,
            "before": before.stdout, "after": after, "path": path, "dir": d}


def test_infer_reads_decorators_partials_and_set_mesh(global_mesh_run):
    rcs, out = global_mesh_run["rcs"], global_mesh_run["out"]
    assert rcs["all"] == 1  # every body checked; one has a violation
    assert 'def layer(x: Varying["dp", "tp"], w: Varying["tp"]) -> Varying["dp"]:' in out
    assert 'def layer_twice(x: Varying["dp", "tp"], w: Varying["tp"]) -> Varying["dp"]:' in out
    assert 'def _scaled(x: Varying["dp", "tp"], w: Varying["tp"]) -> Varying["dp"]:' in out
    assert re.search(r"setmesh_prog\.py:23: SPMD103", out), out
    assert rcs["layer"] == 0 and rcs["scaled"] == 0  # by body name / by the assigned name
    assert rcs["twice"] == 1
    assert rcs["mesh_flag"] == 0  # --mesh on a module that calls jax.set_mesh
    assert rcs["no_such"] == 2 and "no jax.shard_map call of nothing_here" in global_mesh_run["err"]


def test_port_reads_the_module_and_keeps_the_numbers(global_mesh_run, tmp_path):
    assert global_mesh_run["rcs"]["port"] == 0
    ported = global_mesh_run["path"].read_text()
    # typed all the way: st.psum (mypy types it), st.shard_map, observed annotations
    assert "st.lax." not in ported and "jax.lax.psum" not in ported
    assert '@st.shard_map(in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp"))' in ported
    assert 'def layer(x: Varying["dp", "tp"], w: Varying["tp"]) -> Varying["dp"]:' in ported
    assert "return st.psum(y, \"tp\")  # BUG: SPMD103" in ported
    after = global_mesh_run["after"]
    assert after.returncode == 0, after.stderr
    assert after.stdout == global_mesh_run["before"]
    pytest.importorskip("mypy")
    errors = [ln for ln in _mypy([global_mesh_run["path"]], global_mesh_run["dir"]).splitlines()
              if ": error:" in ln]
    bug = next(i for i, ln in enumerate(ported.splitlines(), 1) if "# BUG" in ln)
    assert len(errors) == 1 and f"setmesh_prog.py:{bug}:" in errors[0], errors


WITH_BLOCK = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 4), ("dp", "tp"))
xs = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("dp")))


def body(x):
    return jax.lax.pmean(jnp.sin(x), "dp")


with jax.set_mesh(mesh):
    step = jax.shard_map(body, in_specs=P("dp"), out_specs=P())
    total = step(xs)
'''

NEEDS_FLAGS = '''
import jax
from jax.sharding import PartitionSpec as P

IN_SPECS = (P("dp"),)


def double(x):
    return jax.lax.psum(jax.lax.psum(x, "dp"), "dp")


def build(mesh):
    return jax.shard_map(double, mesh=mesh, in_specs=IN_SPECS, out_specs=P())
'''


def _write(tmp_path: pathlib.Path, name: str, text: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_infer_with_block_assignment_and_module_arrays(tmp_path, capsys):
    path = _write(tmp_path, "cli_with_block", WITH_BLOCK)
    assert _infer_cli.main([path]) == 0
    out = capsys.readouterr().out
    assert 'def body(x: Varying["dp"]) -> Invariant:' in out
    assert _infer_cli.main([f"{path}:step"]) == 0  # the assigned name


def test_infer_says_which_flags_it_needs(tmp_path, capsys):
    path = _write(tmp_path, "cli_needs_flags", NEEDS_FLAGS)
    assert _infer_cli.main([path]) == 2
    err = capsys.readouterr().err
    assert "jax.shard_map(double)" in err and "--mesh --shapes" in err
    # the specs come from the source (IN_SPECS, a module constant); the flags fill in the rest
    assert _infer_cli.main([f"{path}:double", "--mesh", "dp=2,tp=4", "--shapes", "f32[8]"]) == 1
    assert "SPMD103" in capsys.readouterr().out
    assert _infer_cli.main([path, "--mesh", "dp=2", "--shapes", "f32[8]"]) == 1


VMA_OFF_AND_HELPER = '''
from functools import partial

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 4), ("dp", "tp"))
w = jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh, P()))
x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("dp")))


def act(h):
    return jnp.tanh(h)


def model(w, x):
    def body(c, _):
        return jnp.tanh(c @ w), None

    def halve(i, c):
        return act(c) * 0.5

    h, _ = jax.lax.scan(body, jnp.sin(x), None, length=2)
    h = jax.lax.fori_loop(0, 2, halve, h)
    acc = jax.lax.fori_loop(0, 2, lambda i, c: c * 0.5, jnp.cos(h))
    return jax.lax.pmean(acc, "dp")


@partial(jax.shard_map, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P(), check_vma=False)
def legacy(w, x):
    return jax.lax.psum(jnp.tanh(x @ w), "dp")


step = jax.shard_map(model, mesh=mesh, in_specs=(P(), P("dp")), out_specs=P())
reference = act(x)  # global code calls the helper too
RESULT = step(w, x)
LEGACY = legacy(w, x)
'''


def test_port_loops_vma_off_and_global_helpers(tmp_path, capsys):
    """Typed fori_loop bodies run under st.fori_loop, raw ones get raw carries; a check_vma=False call
    stays on the adapter; a helper global code also calls stays raw; same numbers."""
    path = _write(tmp_path, "cli_loops", VMA_OFF_AND_HELPER)
    assert _port_cli.main([path, "--write"]) == 0
    err = capsys.readouterr().err
    assert "kept raw (also called outside shard_map): act" in err
    ported = pathlib.Path(path).read_text()
    assert "h, _ = jax.lax.scan(body, st.numpy.sin(x), None, length=2)" in ported
    assert "h = st.fori_loop(0, 2, halve, h)" in ported  # halve returns act's raw values
    assert "jax.lax.fori_loop(0, 2, lambda i, c: c * 0.5, st.unwrap(st.numpy.cos(h)))" in ported
    assert "@partial(st.adapters.typed_shard_map, mesh=mesh" in ported
    assert "def act(h):\n    return jnp.tanh(h)" in ported
    assert 'def model(w: Invariant, x: Varying["dp"]) -> Invariant:' in ported
    import importlib.util

    spec = importlib.util.spec_from_file_location("cli_loops_ported", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    raw = {}
    exec(compile(textwrap.dedent(VMA_OFF_AND_HELPER), path, "exec"), raw)  # noqa: S102
    for name in ("RESULT", "LEGACY", "reference"):
        assert isinstance(getattr(mod, name), jax.Array)
        np.testing.assert_array_equal(np.asarray(getattr(mod, name)), np.asarray(raw[name]))


def test_port_static_spec_mode_emits_typed_collectives(tmp_path, capsys):
    """Without what tracing needs (or with --static): annotations from the specs, and st.psum
    where the annotated state reaches it and the result stays typed."""
    path = _write(tmp_path, "cli_static", NEEDS_FLAGS)
    assert _port_cli.main([path, "--static"]) == 0
    diff = capsys.readouterr().out
    assert '+def double(x: Varying["dp"]) -> Invariant:' in diff
    assert '+    return st.psum(st.psum(x, "dp"), "dp")' in diff
    assert "st.lax." not in diff


def test_codemod_forms_without_tracing():
    """check_vma=False through `from jax import shard_map` stays on the adapter; the axis-size
    idiom is annotated `int`; a spec-mode parameter used as a pytree is not annotated as one
    array."""
    from spmdtyped.adapters._port.codemod import port_source
    from spmdtyped.adapters._port.observe import Observed

    src = textwrap.dedent('''\
        import jax
        from jax import lax, shard_map
        from jax.sharding import PartitionSpec as P


        def norm(x):
            n = lax.psum(x.shape[-1], "tp")
            return lax.psum(x.sum(-1), "tp") / n


        old = shard_map(norm, mesh=None, in_specs=P("dp"), out_specs=P(), check_vma=False)
        ''')
    obs = {("norm", 6): Observed("norm", 6, {"x": 'Varying["dp", "tp"]'}, 'Varying["dp"]', True)}
    new, _ = port_source(src, obs, {})
    assert "st.adapters.typed_shard_map(norm, mesh=None" in new and "import spmdtyped as st" in new
    assert '    n: int = lax.psum(x.shape[-1], "tp")' in new
    assert '    return st.psum(x.sum(-1), "tp") / n' in new
    tree = textwrap.dedent('''\
        import jax
        from jax.sharding import PartitionSpec as P


        def f(params, x):
            return jax.lax.psum(x @ params["w"], "dp")


        g = jax.shard_map(f, mesh=None, in_specs=(P(), P("dp")), out_specs=P())
        ''')
    new, changes = port_source(tree)
    assert 'def f(params, x: Varying["dp"]) -> Invariant:' in new
    assert "unannotated: f.params" in changes


TWO_MESHES = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 4), ("dp", "tp"))
jax.set_mesh(mesh)
x = jax.device_put(jnp.arange(256.0).reshape(8, 32) / 256, NamedSharding(mesh, P("dp", "tp")))
w = jax.device_put(jnp.ones((32, 4)) / 32, NamedSharding(mesh, P("tp", None)))


@jax.shard_map(in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp"), check_vma=CHECKS)
def layer(x, w):
    return jax.lax.psum(jnp.tanh(x) @ w, "tp")


y = layer(x, w)

# a notebook's next cell: another mesh made current (JAX's shard_map tutorial does this)
ring = jax.make_mesh((8,), ("sp",))
jax.set_mesh(ring)
t = jax.device_put(jnp.arange(64.0), NamedSharding(ring, P("sp")))


@jax.shard_map(in_specs=P("sp"), out_specs=P())
def total(t):
    return jax.lax.psum(jax.lax.psum(t.sum(), "sp"), "sp")  # BUG: SPMD103


z = total(t)
'''

TWO_MESHES_DRIVER = '''
import contextlib, io, json, sys
from spmdtyped._cli import infer, port
checked, unchecked = sys.argv[1:3]
got = {}
for name, call in (("infer", lambda: infer.main([checked])), ("port", lambda: port.main([checked])),
                   ("vma", lambda: port.main(["--enable-vma", unchecked]))):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = call()
    got[name] = [rc, out.getvalue(), err.getvalue()]
print("GOT=" + json.dumps(got))
'''


def test_each_call_is_traced_on_its_own_mesh(tmp_path):
    """A module that makes a second mesh current after a shard_map on its first (a notebook's
    cells, JAX's shard_map tutorial): `infer`, `port` and `port --enable-vma` trace each call
    with its own mesh current. They used to trace it against the module's last mesh, which
    JAX refuses ("The context mesh ... should match the mesh passed to shard_map"): infer
    reported a crash, port left the function unannotated, and --enable-vma said JAX still
    rejected a body it accepts."""
    pytest.importorskip("libcst")
    checked, unchecked = tmp_path / "two_meshes.py", tmp_path / "two_meshes_vma.py"
    checked.write_text(TWO_MESHES.replace("CHECKS", "True"))
    unchecked.write_text(TWO_MESHES.replace("CHECKS", "False"))
    (tmp_path / "driver.py").write_text(TWO_MESHES_DRIVER)
    proc = _run(str(tmp_path / "driver.py"), str(checked), str(unchecked), cwd=tmp_path)
    m = re.search(r"GOT=(\{.*\})", proc.stdout)
    assert m, proc.stdout + proc.stderr
    got = json.loads(m.group(1))
    rc, out, err = got["infer"]
    assert rc == 1 and "failed" not in err, err   # total's double psum, nothing else
    assert 'def layer(x: Varying["dp", "tp"], w: Varying["tp"]) -> Varying["dp"]:' in out
    assert re.search(r"two_meshes\.py:27: SPMD103", out), out
    rc, out, err = got["port"]
    assert rc == 0 and '+def layer(x: Varying["dp", "tp"], w: Varying["tp"]) -> Varying["dp"]:' in out, out + err
    rc, out, err = got["vma"]
    assert rc == 0 and "check_vma=True" in out and "still rejects" not in err, out + err


NOTEBOOK = '''
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

mesh = jax.make_mesh((4, 2), ("i", "j"))
jax.set_mesh(mesh)


@jax.shard_map(in_specs=P("i", "j"), out_specs=P("i"))
def f(x):
    return jax.lax.psum(x, "j")


y = f(jax.device_put(jnp.arange(64.0).reshape(8, 8), P("i", "j")))   # no name to read

# the next cell: the same name rebound, on another mesh
mesh = jax.make_mesh((8,), ("i",))
jax.set_mesh(mesh)


@jax.shard_map(in_specs=P("i"), out_specs=P())
def f(x):
    return jax.lax.psum(jax.lax.psum(x.sum(), "i"), "i")  # BUG: SPMD103


y = f(jax.device_put(jnp.arange(16.0), P("i")))


@jax.jit
@jax.shard_map(out_specs=P())   # in_specs: JAX reads them from the arguments' shardings
def mean_loss(batch):
    return jax.lax.pmean(jnp.mean(batch ** 2), "i")


loss = mean_loss(jax.device_put(jnp.ones((16, 4)), P("i")))


@jax.shard_map(in_specs=P("dp"), out_specs=P("dp"))
def scale(x):
    return x * jax.lax.axis_size("dp")


# decorated before its mesh is current, called after: JAX takes the mesh at the call
jax.set_mesh(jax.make_mesh((2, 4), ("dp", "tp")))
z = scale(jax.device_put(jnp.ones(8), P("dp")))


@jax.shard_map(in_specs=(), out_specs=P("dp", "tp"))   # no arguments: nothing to shape
def device_ids():
    return (jax.lax.axis_index("dp") * 4 + jax.lax.axis_index("tp")).reshape(1, 1)


print(device_ids())
'''


def _command(tmp_path: pathlib.Path, path: pathlib.Path, command: str, *flags: str
             ) -> subprocess.CompletedProcess[str]:
    """`python -m spmdtyped COMMAND PATH FLAGS...` in a subprocess (the module sets a global
    mesh), through its `main` as the other tests call it."""
    driver = (f"import sys\nfrom spmdtyped._cli import {command}\n"
              f"sys.exit({command}.main([sys.argv[1], *{list(flags)!r}]))\n")
    (tmp_path / "driver.py").write_text(driver)
    return _run(str(tmp_path / "driver.py"), str(path), cwd=tmp_path)


def test_infer_reads_a_notebooks_calls(tmp_path):
    """A module written as a notebook's cells (JAX's shard_map tutorial): arrays built inline
    in the calls, names rebound from cell to cell, a jitted step whose in_specs JAX reads from
    the arguments' shardings, a function decorated before its mesh is current, a body of no
    arguments (`in_specs=()`). The shapes,
    shardings and mesh come from the calls the import makes (recorded by the profile hook),
    not from the module's names after it: each body is traced as it ran, and the one bug is
    reported. (They used to need --shapes for every body.)"""
    path = tmp_path / "notebook.py"
    path.write_text(NOTEBOOK)
    proc = _command(tmp_path, path, "infer")
    out = proc.stdout
    assert proc.returncode == 1 and "error" not in proc.stderr, out + proc.stderr
    assert 'def f(x: Varying["i", "j"]) -> Varying["i"]:' in out
    assert 'def f(x: Varying["i"]) -> Invariant:' in out
    assert re.findall(r"notebook\.py:\d+: SPMD\d+", out) == ["notebook.py:24: SPMD103"], out
    assert 'def mean_loss(batch: Varying["i"]) -> Invariant:' in out
    assert 'def scale(x: Varying["dp"]) -> Varying["dp"]:' in out
    assert 'def device_ids() -> Varying["dp", "tp"]:' in out


NO_OUTPUT = '''
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

mesh = jax.make_mesh((2,), ("i",))
jax.set_mesh(mesh)


@jax.shard_map(in_specs=P("i"), out_specs=P("i"))
def double(x):
    return x * 2


y = double(jax.device_put(jnp.arange(4.0), P("i")))   # traced: the port is checked


@jax.shard_map(in_specs=P(), out_specs=None)   # returns nothing (JAX's tutorial)
def show(x):
    print(jax.typeof(jax.lax.pcast(x, "i", to="varying")))


show(jnp.arange(6.0))

NOTHING = None   # JAX's empty output, by name


@jax.shard_map(in_specs=P(), out_specs=NOTHING)
def show_sum(x):
    print("sum", jax.typeof(jax.lax.pcast(x + x, "i", to="varying")))


show_sum(jnp.arange(6.0))
'''


def test_port_keeps_a_body_without_outputs_running(tmp_path):
    """`out_specs=None` is JAX's empty output; to `st.shard_map` None means "derive the specs
    from the hints". The checked port of such a call is `typed_shard_map`, and the ported
    module runs (it used to become `st.shard_map` and raise SPMD402). So is the port of a call
    whose out_specs is a name the module binds to None."""
    pytest.importorskip("libcst")
    path = tmp_path / "no_output.py"
    path.write_text(NO_OUTPUT)
    proc = _command(tmp_path, path, "port", "--write")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ported = path.read_text()
    assert "@st.shard_map(in_specs=P(\"i\"), out_specs=P(\"i\"))" in ported, ported
    assert "@st.adapters.typed_shard_map(in_specs=P(), out_specs=None)" in ported, ported
    assert "@st.adapters.typed_shard_map(in_specs=P(), out_specs=NOTHING)" in ported, ported
    after = _run(str(path), cwd=tmp_path)
    assert after.returncode == 0 and "float32[6]{V:i}" in after.stdout, after.stdout + after.stderr
    assert "sum float32[6]{V:i}" in after.stdout, after.stdout


REBOUND = '''
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

mesh = jax.make_mesh((2, 4), ("dp", "tp"))
jax.set_mesh(mesh)
x = jax.device_put(jnp.ones((8, 32)) / 32, NamedSharding(mesh, P("dp", "tp")))
w = jax.device_put(jnp.ones((32, 4)), NamedSharding(mesh, P("tp", None)))


@jax.shard_map(in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp"))
def layer(x, w):
    w = w * 2                        # a parameter rebound in its own state
    x = jax.lax.psum(x @ w, "tp")   # and one rebound in another
    return jnp.tanh(x)


y = layer(x, w)
'''


def test_port_leaves_a_parameter_rebound_in_another_state_unannotated(tmp_path):
    """`x = psum(x @ w, "tp")` rebinds a parameter to another state (the tutorial's
    `y = pcast(y, "i", to="varying")` too): annotated with its state at the call, the
    assignment is a mypy error. The checked port leaves it unannotated (and says so), keeps
    the annotation of a parameter rebound in its own state, and mypy with the plugin accepts
    the result."""
    pytest.importorskip("libcst")
    pytest.importorskip("mypy")
    path = tmp_path / "rebound.py"
    path.write_text(REBOUND)
    proc = _command(tmp_path, path, "port", "--write")
    assert proc.returncode == 0 and "layer.x" in proc.stderr, proc.stdout + proc.stderr
    ported = path.read_text()
    assert 'def layer(x, w: Varying["tp"]) -> Varying["dp"]:' in ported, ported
    assert [ln for ln in _mypy([path], tmp_path).splitlines() if ": error:" in ln] == []
