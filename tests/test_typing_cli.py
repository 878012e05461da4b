"""`python -m spmdtyped check PATH...`: mypy with the plugin added to the user's configuration."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from test_typing import CACHE, REPO

from spmdtyped._cli import check as _cli_check

# jax and numpy are not needed to exercise the CLI: keep the runs fast
FAST = ("--no-site-packages", "--ignore-missing-imports")

PROGRAM = """\
import spmdtyped as st
from spmdtyped import Reduced, Varying

def f(w: Reduced["tp"], x: Varying["dp"]) -> None:
    st.psum(w, "tp")
    st.psum(st.psum(x, "dp"), "dp")
"""


def check(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "spmdtyped", "check", *args, *FAST,
                           "--cache-dir", str(CACHE / f"cli-{tmp.name}")],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=600)


def test_check_reports_with_the_plugin(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    proc = check(tmp_path, "prog.py")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "prog.py:5: error: st.psum over 'tp': the value is Reduced" in proc.stdout
    assert "[spmd-reduced-operand]" in proc.stdout
    assert "prog.py:6: error:" in proc.stdout and "[spmd-invariant-operand]" in proc.stdout


def test_check_clean_exit_code(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("import spmdtyped as st\nfrom spmdtyped import Varying\n\n"
                                    "def f(x: Varying['dp']) -> st.Invariant:\n"
                                    "    return st.psum(x, 'dp')\n")
    proc = check(tmp_path, "ok.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_extends_the_users_pyproject(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PROGRAM)
    (tmp_path / "pyproject.toml").write_text(
        '[tool.mypy]\ndisable_error_code = ["spmd-invariant-operand"]\nwarn_unused_ignores = true\n'
        '[[tool.mypy.overrides]]\nmodule = ["legacy.*"]\nignore_errors = true\n')
    proc = check(tmp_path, "prog.py")
    assert proc.returncode == 1
    assert "[spmd-reduced-operand]" in proc.stdout
    assert "spmd-invariant-operand" not in proc.stdout, proc.stdout


def test_check_usage_errors(tmp_path: Path) -> None:
    proc = check(tmp_path, "--config-file", "missing.ini", "x.py")
    assert proc.returncode == 2
    assert "no such config file" in proc.stderr


def test_merged_config_keeps_user_plugins(tmp_path: Path) -> None:
    user = tmp_path / "mypy.ini"
    user.write_text("[mypy]\nplugins = pydantic.mypy\nstrict = True\n[mypy-foo.*]\nignore_errors = True\n")
    assert _cli_check.find_config(None, tmp_path) == user
    ini = _cli_check.merged_config(user, tmp_path)
    cp = configparser.ConfigParser(interpolation=None)
    cp.read(ini)
    assert cp["mypy"]["plugins"] == "pydantic.mypy, spmdtyped.mypy_plugin"
    assert cp["mypy"]["strict"] == "True"
    assert cp["mypy-foo.*"]["ignore_errors"] == "True"


def test_find_config_order(tmp_path: Path) -> None:
    assert _cli_check.find_config(None, tmp_path) is None
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")
    assert _cli_check.find_config(None, tmp_path) is None  # no [mypy] section
    (tmp_path / "pyproject.toml").write_text("[tool.mypy]\nstrict = true\n")
    assert _cli_check.find_config(None, tmp_path) == tmp_path / "pyproject.toml"
    (tmp_path / ".mypy.ini").write_text("[mypy]\n")
    assert _cli_check.find_config(None, tmp_path) == tmp_path / ".mypy.ini"


def test_check_strict_turns_unknown_on(tmp_path: Path) -> None:
    """`python -m spmdtyped check --strict`: mypy's --strict and `spmd-unknown`; without
    --strict the same file reports none of it. The user's `[spmdtyped]` section is kept."""
    src = tmp_path / "prog.py"
    src.write_text("import jax.numpy as jnp\nfrom spmdtyped import Varying\n\n\n"
                   "def f(x: Varying['dp']) -> Varying['dp']:\n"
                   "    return jnp.clip(x, -1.0, 1.0)\n")
    (tmp_path / "mypy.ini").write_text("[mypy]\nignore_missing_imports = True\n"
                                       "[spmdtyped]\njax = 0.12\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), SPMDTYPED_PLUGIN_DEBUG="1")

    def check(*args: str) -> str:
        proc = subprocess.run([sys.executable, "-m", "spmdtyped", "check", *args,
                               "--cache-dir", str(CACHE / "cli-strict"), "prog.py"], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)
        return proc.stdout + proc.stderr

    strict = check("--strict")
    assert "prog.py:6: error: `jnp.clip` has no surface row" in strict, strict
    assert strict.count("[spmd-unknown]") == 1, strict
    assert "[spmd-unknown]" not in check(), "off without --strict"
    # the section reaches the plugin: a bad value is its configuration error
    (tmp_path / "mypy.ini").write_text("[mypy]\n[spmdtyped]\njax = 9.9\n")
    assert "[spmdtyped] jax = '9.9'" in check()


def test_merged_config_carries_the_spmdtyped_section(tmp_path: Path) -> None:
    """`[tool.spmdtyped]` of pyproject.toml reaches the plugin as `[spmdtyped]`; `--strict`
    adds `unknown = true` to it."""
    (tmp_path / "pyproject.toml").write_text('[tool.mypy]\nstrict = true\n\n'
                                             '[tool.spmdtyped]\njax = "0.12"\n')
    cp = configparser.ConfigParser()
    cp.read(_cli_check.merged_config(tmp_path / "pyproject.toml", tmp_path, strict=True))
    assert dict(cp["spmdtyped"]) == {"jax": "0.12", "unknown": "true"}
    cp = configparser.ConfigParser()
    cp.read(_cli_check.merged_config(tmp_path / "pyproject.toml", tmp_path))
    assert dict(cp["spmdtyped"]) == {"jax": "0.12"}


def _page_program(tmp_path: Path, heading: str, flags: list[str], cache: str,
                  keep: Callable[[str], bool]) -> None:
    """The Python program of docs/static.md's section `heading`, run through `check` with
    `flags`: the lines `keep` selects from its output are the section's `text` block."""
    import re

    page = (REPO / "docs" / "static.md").read_text()
    section = page[page.index(heading):]
    program = re.search(r"```python\n(.*?)```", section, re.S)
    shown = re.search(r"```text\n(.*?)```", section, re.S)
    assert program and shown
    (tmp_path / "prog.py").write_text(program.group(1))
    env = dict(os.environ, PYTHONPATH=str(REPO), SPMDTYPED_PLUGIN_DEBUG="1")
    proc = subprocess.run([sys.executable, "-m", "spmdtyped", "check", *flags, "--cache-dir",
                           str(CACHE / cache), "prog.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    got = [ln for ln in proc.stdout.splitlines() if keep(ln)]
    assert got == shown.group(1).strip().splitlines(), proc.stdout + proc.stderr


def test_docs_unknown_block(tmp_path: Path) -> None:
    """docs/static.md's `spmd-unknown` program: `check --strict` prints the page's lines."""
    _page_program(tmp_path, "### Where the state is lost", ["--strict"], "cli-strict",
                  lambda ln: ln.endswith("[spmd-unknown]"))


def test_static_md_across_functions(tmp_path: Path) -> None:
    """docs/static.md's "Across functions" program: `check` prints the page's errors (a helper
    with no annotations checked on the call's arguments, its result's state, vmap of a grad
    bound to a name)."""
    _page_program(tmp_path, "## Across functions", [], "cli-across",
                  lambda ln: ": error: " in ln)


def test_the_unknown_key_invalidates_mypy_cache(tmp_path: Path) -> None:
    """Turning `[spmdtyped] unknown = true` on (nothing else changed, one cache directory)
    rechecks the cached module: the key is part of the plugin's configuration data."""
    (tmp_path / "prog.py").write_text("import jax.numpy as jnp\nfrom spmdtyped import Varying\n\n\n"
                                      "def f(x: Varying['dp']) -> Varying['dp']:\n"
                                      "    return jnp.clip(x, -1.0, 1.0)\n")
    env = dict(os.environ, PYTHONPATH=str(REPO), SPMDTYPED_PLUGIN_DEBUG="1")

    def check(unknown: str) -> str:
        (tmp_path / "mypy.ini").write_text("[mypy]\nignore_missing_imports = True\n"
                                           f"[spmdtyped]\nunknown = {unknown}\n")
        proc = subprocess.run([sys.executable, "-m", "spmdtyped", "check", "--cache-dir",
                               str(tmp_path / "cache"), "prog.py"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=600)
        return proc.stdout + proc.stderr

    assert "[spmd-unknown]" not in check("false")
    assert "prog.py:6: error: `jnp.clip` has no surface row" in check("true")
    assert "[spmd-unknown]" not in check("false")
