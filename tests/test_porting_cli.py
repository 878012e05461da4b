"""The porting CLIs: `infer` exit codes (0 clean, 1 violations, 2 usage or crash), modules that
call `jax.set_mesh` at import, decorated targets; `check` passing mypy options through in both
forms, `--cache-dir`, and folders of scripts that import each other."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from spmdtyped._cli import check as _cli_check
from spmdtyped._cli import infer as _cli

ROOT = pathlib.Path(__file__).resolve().parent.parent

MODULE = '''
import functools

import jax
from jax.sharding import PartitionSpec as P

mesh = jax.make_mesh((2, 4), ("dp", "tp"))
_ctx = jax.set_mesh(mesh)  # global, as scripts do (the test restores it)


@jax.shard_map(in_specs=(P("dp", "tp"), P("tp", None)), out_specs=P("dp"))
def layer(x, w):
    return jax.lax.psum(x @ w, "tp")


@jax.jit
def double(x):
    return jax.lax.psum(jax.lax.psum(x, "dp"), "dp")


def shape_error(x):
    return x @ x


def _scaled(x, scale):
    return jax.lax.psum(x * scale, "dp")


scaled = functools.partial(_scaled, scale=2.0)
'''


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "setmesh_mod.py"
    path.write_text(MODULE)
    yield str(path)
    loaded = sys.modules.get("setmesh_mod")
    if loaded is not None:  # the CLI imported it in this process: undo its global mesh
        loaded._ctx.__exit__(None, None, None)
        del sys.modules["setmesh_mod"]


LAYER = ["--in-specs", "(P('dp', 'tp'), P('tp', None))", "--out-specs", "P('dp')",
         "--shapes", "f32[8,32] f32[32,4]"]
ONE = ["--in-specs", "P('dp')", "--out-specs", "P()", "--shapes", "f32[8]"]


def test_infer_set_mesh_module_and_decorated_target(module, capsys):
    assert _cli.main([f"{module}:layer", *LAYER]) == 0
    out = capsys.readouterr().out
    assert 'def layer(x: Varying["dp", "tp"], w: Varying["tp"]) -> Varying["dp"]:' in out
    assert _cli.main([f"{module}:scaled", *ONE]) == 0


def test_infer_exit_codes(module, capsys):
    assert _cli.main([f"{module}:double", *ONE]) == 1  # a jitted target, a violation
    assert "SPMD103" in capsys.readouterr().out
    assert _cli.main([f"{module}:shape_error", *ONE[:-1], "f32[8,3]"]) == 2  # a crash
    assert "tracing" in capsys.readouterr().err
    assert _cli.main(["no_such_module_xyz:f", *ONE]) == 2
    assert _cli.main([f"{module}:layer", *LAYER[:-1], "f32[8,32]"]) == 2  # usage


def test_infer_subprocess_exit_status(module):
    """The real entry point (python -m spmdtyped infer): exit status 1, not a traceback."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run([sys.executable, "-m", "spmdtyped", "infer", f"{module}:double", *ONE],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("argv,config,rest", [
    (["src", "--cache-dir", "c", "--strict"], None, ["src", "--cache-dir", "c", "--strict"]),
    (["--cache-dir=c", "src"], None, ["--cache-dir=c", "src"]),
    (["--config-file", "m.ini", "src"], "m.ini", ["src"]),
    (["--config-file=m.ini", "--python-version", "3.11", "src"], "m.ini",
     ["--python-version", "3.11", "src"]),
])
def test_check_passes_options_through_in_both_forms(argv, config, rest):
    assert _cli_check.split_config_file(argv) == (config, rest)


def _check(cwd, *argv):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "spmdtyped", "check", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_check_folder_of_scripts_importing_each_other(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "util.py").write_text("def helper(x: int) -> int:\n    return x + 1\n")
    (flat / "main.py").write_text("import util\n\ny: str = util.helper(1)\n")
    proc = _check(tmp_path, "flat", f"--cache-dir={tmp_path / 'c1'}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "found twice" not in proc.stdout and "main.py:3: error: Incompatible types" in proc.stdout
    assert (tmp_path / "c1").is_dir()


def test_check_folder_imported_as_a_package(tmp_path):
    """examples/broken/*.py import `from examples import x`: files and imports agree."""
    pkg = tmp_path / "scripts"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "util.py").write_text("def helper(x: int) -> int:\n    return x + 1\n")
    (pkg / "sub" / "main.py").write_text(textwrap.dedent("""
        from scripts import util

        y: int = util.helper(1)
    """))
    proc = _check(tmp_path, "scripts", "--cache-dir", str(tmp_path / "c2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "c2").is_dir()
