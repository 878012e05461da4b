"""Static checking: `tests/typing/*.py` under mypy + plugin, plain mypy, pyright, and pyright
with the generated stub (the editor tier, docs/pyright.md).

Each file says which checkers ("legs") it runs under in its first line (`# legs: plugin mypy
pyright`) and marks every line that must fail with trailing markers, one per expected error:

- `# E: spmd-reduced-operand` -- mypy with `plugins = spmdtyped.mypy_plugin` (error code);
- `E[mypy]: return-value`     -- plain mypy, no plugin (error code);
- `E[pyright]: reportReturnType` -- pyright (rule name);
- `E[stub]: reportDeprecated`  -- pyright with the stub of `stubgen --axes dp,tp` (rule name);
- `E[unknown]: spmd-unknown`   -- mypy with the plugin and `[spmdtyped] unknown = true` (the
  opt-in `spmd-unknown`: where a typed value's state is lost); such a file lists the `plugin`
  leg too, where (the key off) it must report none of it.

A leg must report exactly the marked (line, code) pairs of its files: no more, no fewer. All
files of a leg are checked in one run, with a persistent cache under the system temp dir, so
only the first run pays for analysing JAX's stubs.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from _helpers import pyright

REPO = Path(__file__).resolve().parent.parent
TYPING = REPO / "tests" / "typing"
#: one mypy cache per checkout, Python and pytest-xdist worker (two checkouts of the package
#: must not share one: mypy keys its cache by module name; two mypy processes must not write
#: one cache at the same time: `.ci/run` runs two legs side by side, `make test` two workers)
CACHE = Path(tempfile.gettempdir()) / (f"spmdtyped-mypy-cache-py{sys.version_info[0]}{sys.version_info[1]}-"
                                       f"{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}"
                                       f"-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}")

_MARK = re.compile(r"(?:^|\s)E(?:\[(?P<leg>\w+)\])?:\s*(?P<codes>[\w-]+(?:[ ,]+(?!E\b|E\[)[\w-]+)*)")
_MYPY_LINE = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<msg>.*?)  \[(?P<code>[\w-]+)\]$")

Expected = collections.Counter  # (file name, line, code) -> count


def typing_files(leg: str) -> list[Path]:
    out = []
    for path in sorted(TYPING.glob("*.py")):
        first = path.read_text().splitlines()[0] if path.read_text() else ""
        if first.startswith("# legs:") and leg in first.split(":", 1)[1].split():
            out.append(path)
    return out


def expected(files: list[Path], leg: str) -> Expected:
    """The (file, line, code) markers of `leg` ("plugin" markers are the bare `E:`)."""
    want: Expected = collections.Counter()
    for path in files:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if "#" not in line:
                continue
            comment = line.split("#", 1)[1]
            for m in _MARK.finditer(comment):
                if (m.group("leg") or "plugin") == leg:
                    for code in re.split(r"[ ,]+", m.group("codes").strip()):
                        want[(path.name, n, code)] += 1
    return want


def mypy_config(tmp: Path, plugin: bool, extra: str = "") -> Path:
    cfg = tmp / ("mypy-plugin.ini" if plugin else "mypy-plain.ini")
    lines = ["[mypy]", "plugins = spmdtyped.mypy_plugin" if plugin else "", f"mypy_path = {REPO}",
             "show_error_codes = True", "pretty = False", extra,
             "[mypy-spmdtyped.*]", "ignore_errors = True"]
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def run_mypy(files: list[Path], config: Path, cache: Path, cwd: Path = TYPING,
             extra_args: tuple[str, ...] = (), python: str = sys.executable) -> tuple[int, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               SPMDTYPED_PLUGIN_DEBUG="1")  # a bug in a hook crashes mypy instead of hiding
    proc = subprocess.run(
        [python, "-m", "mypy", "--config-file", str(config), "--cache-dir", str(cache),
         "--no-error-summary", *extra_args, *[str(f) for f in files]],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 1) or "INTERNAL ERROR" in proc.stdout + proc.stderr:
        raise AssertionError(f"mypy crashed (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc.returncode, proc.stdout


def mypy_errors(stdout: str) -> Expected:
    got: Expected = collections.Counter()
    for line in stdout.splitlines():
        m = _MYPY_LINE.match(line)
        if m:
            got[(Path(m.group("file")).name, int(m.group("line")), m.group("code"))] += 1
    return got


def _diff(want: Expected, got: Expected, output: str) -> str:
    missing = sorted((want - got).elements())
    extra = sorted((got - want).elements())
    return (f"missing (expected, not reported): {missing}\nunexpected (reported, not marked): "
            f"{extra}\n--- checker output ---\n{output}")


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str]:
    files = typing_files("plugin")
    cfg = mypy_config(tmp_path_factory.mktemp("cfg"), plugin=True)
    return run_mypy(files, cfg, CACHE / "plugin")


def test_typing_files_exist() -> None:
    for leg in ("plugin", "mypy", "pyright", "stub"):
        files = typing_files(leg)
        assert any(f.name.startswith("pass_") for f in files), leg
        assert any(f.name.startswith("fail_") for f in files), leg
        assert sum(expected(files, leg).values()) > 0, leg


def test_mypy_with_plugin(plugin_run: tuple[int, str]) -> None:
    rc, out = plugin_run
    want = expected(typing_files("plugin"), "plugin")
    got = mypy_errors(out)
    assert got == want, _diff(want, got, out)
    assert rc == 1


def test_pass_files_are_clean_with_plugin(plugin_run: tuple[int, str]) -> None:
    _, out = plugin_run
    assert not [ln for ln in out.splitlines() if ln.startswith("pass_") and ": error:" in ln], out


def test_seed_error_names_the_fix(plugin_run: tuple[int, str]) -> None:
    """The seed mistake (an axis op on a Reduced value): headline, code, fix and docs pointer."""
    _, out = plugin_run
    source = (TYPING / "fail_plugin.py").read_text().splitlines()
    n = 1 + next(i for i, ln in enumerate(source) if 'st.psum(w, "tp")  # E:' in ln)
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"fail_plugin.py:{n}: error:"))
    assert "st.psum over 'tp': the value is Reduced on 'tp'" in lines[i]
    assert lines[i].endswith("[spmd-reduced-operand]")
    # the first fix keeps the numbers (issue 26); the pcast route is named as changing them
    assert "fix: drop the st.psum: x is already reduced (replicated) over 'tp'" in lines[i + 1]
    assert "st.psum(st.pcast(x, 'tp', to='varying'), 'tp')" in lines[i + 1]
    assert "changes the numbers" in lines[i + 1]
    assert "python -m spmdtyped explain SPMD101" in lines[i + 2]


def test_helper_mistakes_name_their_line(plugin_run: tuple[int, str]) -> None:
    """A mistake inside an unannotated `__call__` / helper method of the flax nnx Llama
    (fail_llama_nnx.py) is reported at the typed call, naming the method and the line of the
    mistake (`# MISTAKE:`), a helper's helper as a chain of lines, with the rule's fix."""
    _, out = plugin_run
    source = (TYPING / "fail_llama_nnx.py").read_text().splitlines()
    mistakes = {n for n, ln in enumerate(source, 1) if re.search(r"# MISTAKE: \w+", ln)}
    lines = out.splitlines()
    named = set()
    for i, ln in enumerate(lines):
        if ln.startswith("fail_llama_nnx.py:") and ": error: in `" in ln:
            at = [int(m) for m in re.findall(r"\(line (\d+)\)", ln)]
            assert at and at[-1] in mistakes, ln
            named.add(at[-1])
            assert "fix: st.psum(x, 'tp') + b" in lines[i + 1], lines[i + 1]
    inner = next(n for n, ln in enumerate(source, 1) if "+ self.b_down[...]  # MISTAKE" in ln
                 and "def down" in source[n - 2])
    call = next(n for n, ln in enumerate(source, 1) if n > inner and "psum(self.down(h), " in ln)
    assert f"`MLPBiasInDown.__call__` (line {call}) -> `MLPBiasInDown.down` (line {inner})" in out, out
    # every mistake in a method is named; the pmean one is in the typed step, at its own line
    pmean = next(n for n, ln in enumerate(source, 1) if "MISTAKE: pmean_reduced_grads" in ln)
    assert named == mistakes - {pmean}
    assert any(ln.startswith(f"fail_llama_nnx.py:{pmean}: error:") for ln in lines)


def test_return_mismatch_is_the_out_boundary_error(plugin_run: tuple[int, str]) -> None:
    """A state mismatch at a `return` is the runtime's out-boundary rule (`_rules.check_return`,
    SPMD401) with its fix, not mypy's `return-value` (which it replaces)."""
    _, out = plugin_run
    source = (TYPING / "fail_refine.py").read_text().splitlines()
    n = 1 + next(i for i, ln in enumerate(source) if "return u  # E: spmd-out-spec-state" in ln)
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith(f"fail_refine.py:{n}: error:"))
    assert "return in returns_unreduced: the value is Unreduced over 'tp', but the return hint " \
           "(Invariant) is Invariant over 'tp'" in lines[i], lines[i]
    assert lines[i].endswith("[spmd-out-spec-state]")
    assert "fix: st.psum(y, 'tp') before returning it" in lines[i + 1]
    assert "python -m spmdtyped explain SPMD401" in lines[i + 2]
    assert not [ln for ln in lines if ln.startswith(f"fail_refine.py:{n}:") and "[return-value]" in ln]


_REVEALS = re.compile(r"#.*\breveals:\s*(?P<tokens>.+)$")


def test_refinements_revealed(plugin_run: tuple[int, str]) -> None:
    """`reveal_type(x)  # reveals: tp=S-1, #2` in pass_refine.py: the refinement slot of the
    revealed type holds each token (`plain`: no refinement, the slot is `Any`)."""
    _, out = plugin_run
    source = (TYPING / "pass_refine.py").read_text().splitlines()
    checked = 0
    for n, line in enumerate(source, 1):
        m = _REVEALS.search(line)
        if not m:
            continue
        revealed = [ln for ln in out.splitlines() if ln.startswith(f"pass_refine.py:{n}: note: Revealed type is")]
        assert len(revealed) == 1, (n, out)
        for token in (t.split()[0] for t in m.group("tokens").split(",")):
            if token == "plain":
                assert revealed[0].endswith(', Any]"'), revealed[0]
            else:
                assert f"'{token}'" in revealed[0], (token, revealed[0])
        checked += 1
    assert checked >= 8


# Other mypy versions: interpreters with another mypy (e.g. 1.x), separated by os.pathsep. The
# typing files are analysed against this interpreter's packages (jax) via python_executable.
OTHER_MYPYS = [p for p in os.environ.get("SPMDTYPED_MYPY_PYTHONS", "").split(os.pathsep) if p]


@pytest.mark.skipif(not OTHER_MYPYS, reason="set SPMDTYPED_MYPY_PYTHONS to interpreters with other "
                    "mypy versions (e.g. a venv with mypy 1.20) to run the plugin leg under them")
@pytest.mark.parametrize("python", OTHER_MYPYS)
def test_mypy_other_versions_with_plugin(python: str, tmp_path: Path) -> None:
    version = subprocess.run([python, "-m", "mypy", "--version"], capture_output=True,
                             text=True).stdout.split()[1]
    cfg = mypy_config(tmp_path, plugin=True, extra=f"python_executable = {sys.executable}")
    files = typing_files("plugin")
    _, out = run_mypy(files, cfg, CACHE / f"plugin-mypy{version}", python=python)
    want = expected(files, "plugin")
    got = mypy_errors(out)
    assert got == want, f"mypy {version}\n" + _diff(want, got, out)


# The `unknown` leg: `spmd-unknown` turned on (`[spmdtyped] unknown = true`); markers
# `E[unknown]: spmd-unknown`. The same files under the `plugin` leg (the key off) report nothing
# of it: `unknown` files list both legs.
_UNKNOWN_ON = "[spmdtyped]\nunknown = true"


@pytest.mark.parametrize("python", [sys.executable, *OTHER_MYPYS])
def test_mypy_unknown_leg(python: str, tmp_path: Path) -> None:
    files = typing_files("unknown")
    assert files and all("plugin" in f.read_text().splitlines()[0] for f in files)
    cfg = mypy_config(tmp_path, plugin=True, extra=f"python_executable = {sys.executable}")
    cfg.write_text(cfg.read_text() + _UNKNOWN_ON + "\n")
    _, out = run_mypy(files, cfg, CACHE / f"unknown-{Path(python).parent.parent.name}", python=python)
    want = expected(files, "unknown")
    got = mypy_errors(out)
    assert got == want, _diff(want, got, out)
    assert sum(want.values()) >= 7
    # each report says why, at the first place only (`h * 2.0`, `x + h2` are of the same chain)
    assert "`scale_rows` has no annotations: the result of a Varying['dp'] value is Any" in out
    assert "`jnp.clip` has no surface row" in out and "`jax.nn.standardize` has no surface row" in out
    assert "refinement dropped by `.reshape()`" in out
    assert "`self.rope` (a field with no state hint) is a plain jax.Array" in out


def test_unknown_through_enable_error_code(tmp_path: Path) -> None:
    """mypy's own switch turns it on too; `disable_error_code` wins over the key."""
    files = typing_files("unknown")
    for name in ("on", "off"):
        (tmp_path / name).mkdir()
    on = mypy_config(tmp_path / "on", plugin=True, extra="enable_error_code = spmd-unknown")
    _, out = run_mypy(files, on, CACHE / "unknown-enabled")
    assert mypy_errors(out) == expected(files, "unknown"), out
    off = mypy_config(tmp_path / "off", plugin=True, extra="disable_error_code = spmd-unknown")
    off.write_text(off.read_text() + _UNKNOWN_ON + "\n")
    _, out = run_mypy(files, off, CACHE / "unknown-disabled")
    assert "spmd-unknown]" not in out, out


def test_plain_mypy() -> None:
    """No plugin: the Literal and axis-vocabulary spellings are standard typing."""
    files = typing_files("mypy")
    cfg = mypy_config(Path(tempfile.mkdtemp()), plugin=False)
    rc, out = run_mypy(files, cfg, CACHE / "plain")
    want = expected(files, "mypy")
    got = mypy_errors(out)
    assert got == want, _diff(want, got, out)


def _pyright() -> list[str] | None:
    exe = pyright()
    return None if exe is None else [exe]


def test_pyright(tmp_path: Path) -> None:
    cmd = _pyright()
    if cmd is None:
        pytest.skip("pyright is not installed (pip install pyright==1.1.414)")
    files = typing_files("pyright")
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({
        "extraPaths": [str(REPO), str(TYPING)], "pythonVersion": "3.11",
        "typeCheckingMode": "standard"}))
    try:
        proc = subprocess.run(
            [*cmd, "--outputjson", "-p", str(tmp_path / "pyrightconfig.json"), "--pythonpath",
             sys.executable, *[str(f) for f in files]],
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"pyright could not run here: {e}")
    try:
        report = json.loads(proc.stdout)
    except json.JSONDecodeError:
        # the pip wrapper downloads node/pyright on first use; offline that fails
        pytest.skip(f"pyright could not start (offline?): {(proc.stdout + proc.stderr)[-500:]}")
    got: Expected = collections.Counter()
    for d in report["generalDiagnostics"]:
        if d["severity"] == "error":
            got[(Path(d["file"]).name, d["range"]["start"]["line"] + 1, d.get("rule", "?"))] += 1
    want = expected(files, "pyright")
    assert got == want, _diff(want, got, json.dumps(report["generalDiagnostics"], indent=1))


def test_pyright_with_stub(tmp_path: Path) -> None:
    """The editor tier: pyright with the stub `python -m spmdtyped stubgen` writes (the `stub`
    leg, markers `E[stub]: rule`), with its deprecations as errors, as docs/pyright.md
    configures it. The stub is found before the package (pyright's `stubPath` ranks above the
    interpreter's `sys.path`)."""
    from spmdtyped._stubgen import write

    cmd = _pyright()
    if cmd is None:
        pytest.skip("pyright is not installed (pip install pyright==1.1.414)")
    files = typing_files("stub")
    write(("dp", "tp"), tmp_path / "typings")
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({
        "extraPaths": [str(TYPING)], "pythonVersion": "3.11", "typeCheckingMode": "standard",
        "reportDeprecated": "error", "exclude": ["typings"]}))
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([*cmd, "--outputjson", "--pythonpath", sys.executable,
                           *[str(f) for f in files]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    report = json.loads(proc.stdout)
    got: Expected = collections.Counter()
    for d in report["generalDiagnostics"]:
        if d["severity"] == "error":
            got[(Path(d["file"]).name, d["range"]["start"]["line"] + 1, d.get("rule", "?"))] += 1
        # the stub was read, not the package (which would be the package's own static view)
        assert d.get("rule") != "reportMissingModuleSource", d
    want = expected(files, "stub")
    assert got == want, _diff(want, got, json.dumps(report["generalDiagnostics"], indent=1))


# ---------------------------------------------------------------------------------------------
# The plugin process itself


def test_plugin_does_not_import_jax() -> None:
    code = ("import sys, spmdtyped.mypy_plugin as p; assert p.plugin('2.4.1') is p.SpmdPlugin; "
            "print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), check=True).stdout
    assert out.strip() == "False"


def test_error_codes_follow_the_registry() -> None:
    from mypy import errorcodes

    from spmdtyped import _errors, mypy_plugin

    for code, entry in _errors.REGISTRY.items():
        ec = mypy_plugin.CODES[code]
        assert ec.code == f"spmd-{entry.slug}" == entry.mypy_code
        assert ec.sub_code_of is mypy_plugin.SPMD
        assert errorcodes.error_codes[ec.code] is ec
    assert not mypy_plugin.AXIS.default_enabled


_SMALL = """\
import spmdtyped as st
from spmdtyped import Reduced, Varying

def f(w: Reduced["tp"], x: Varying["dp", "tp"]) -> Varying["dp"]:
    y = st.psum(x, "tp")
    reveal_type(y)
    {body}
    return y
"""
# jax and numpy are not needed to check these: leave site-packages out (fast; dmypy crashes on
# follow_imports=skip for site-packages in mypy 2.4.1)
_FAST = "no_site_packages = True\nignore_missing_imports = True"


def test_incremental_cache(tmp_path: Path) -> None:
    """A cached re-run reports the same errors; editing the file re-runs the hooks."""
    src = tmp_path / "prog.py"
    cfg = mypy_config(tmp_path, plugin=True, extra=_FAST)
    cache = tmp_path / "cache"
    src.write_text(_SMALL.format(body='st.psum(w, "tp")'))
    _, first = run_mypy([src], cfg, cache, cwd=tmp_path)
    _, second = run_mypy([src], cfg, cache, cwd=tmp_path)
    assert first == second
    assert "[spmd-reduced-operand]" in first
    assert "SArray[Literal['dp'], Never, Never, Any]" in first
    src.write_text(_SMALL.format(body='st.psum(st.pcast(w, "tp", to="varying"), "tp")'))
    _, third = run_mypy([src], cfg, cache, cwd=tmp_path)
    assert "error" not in third, third
    assert "SArray[Literal['dp'], Never, Never, Any]" in third


def test_dmypy(tmp_path: Path) -> None:
    """The daemon: fine-grained updates re-run the hooks; dropped name-defined errors stay dropped."""
    src = tmp_path / "prog.py"
    cfg = mypy_config(tmp_path, plugin=True, extra=_FAST)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    status = tmp_path / "dmypy.json"
    base = [sys.executable, "-m", "mypy.dmypy", "--status-file", str(status)]

    def run(*args: str) -> str:
        proc = subprocess.run([*base, *args], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        return proc.stdout + proc.stderr

    src.write_text(_SMALL.format(body='st.psum(w, "tp")'))
    try:
        out1 = run("run", "--", "--config-file", str(cfg), "--cache-dir", str(tmp_path / "c"),
                   "prog.py")
        assert "[spmd-reduced-operand]" in out1, out1
        assert "name-defined" not in out1, out1
        src.write_text(_SMALL.format(body="pass"))
        out2 = run("run", "--", "--config-file", str(cfg), "--cache-dir", str(tmp_path / "c"),
                   "prog.py")
        assert "spmd-" not in out2 and "name-defined" not in out2, out2
        assert "SArray[Literal['dp'], Never, Never, Any]" in out2, out2
        src.write_text(_SMALL.format(body='st.ppermute(w, "tp", [(0, 1)])'))
        out3 = run("run", "--", "--config-file", str(cfg), "--cache-dir", str(tmp_path / "c"),
                   "prog.py")
        assert "st.ppermute over 'tp': the value is Reduced" in out3, out3
    finally:
        run("stop")


def test_plugin_headlines_match_runtime(mesh_ij: object) -> None:
    """The plugin prints the runtime's own headline for the same mistake."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import spmdtyped as st

    caught: list[st.SpmdTypeError] = []

    @st.shard_map(mesh=mesh_ij, in_specs=(P("j"),), out_specs=P())
    def f(x: st.Varying["j"]) -> st.Invariant:
        r = st.all_gather(x, "j", to="reduced", tiled=True)
        try:
            st.psum(r, "j")
        except st.SpmdTypeError as e:
            caught.append(e)
        return st.psum(x.sum(), "j")

    jax.eval_shape(f, jax.ShapeDtypeStruct((8,), jnp.float32, sharding=NamedSharding(mesh_ij, P("j"))))
    (err,) = caught
    tmp = Path(tempfile.mkdtemp())
    probe = tmp / "probe.py"
    probe.write_text("import spmdtyped as st\nfrom spmdtyped import Varying\n\n"
                     "def f(x: Varying['j']) -> None:\n"
                     "    r = st.all_gather(x, 'j', to='reduced', tiled=True)\n"
                     "    st.psum(r, 'j')\n")
    cfg = mypy_config(tmp, plugin=True)
    _, out = run_mypy([probe], cfg, CACHE / "plugin", cwd=tmp)
    assert f"probe.py:6: error: {err.headline}  [spmd-{_code_slug(err.code)}]" in out, (out, err)


def _code_slug(code: str) -> str:
    from spmdtyped._errors import REGISTRY

    return REGISTRY[code].slug


def test_jax_version_setting(tmp_path: Path) -> None:
    """`[spmdtyped] jax = 0.12` checks with jax 0.12's rules (default: what every JAX allows)."""
    src = tmp_path / "prog.py"
    src.write_text("from spmdtyped import Unreduced\n\n"
                   "def f(u: Unreduced['tp']) -> None:\n"
                   "    reveal_type(-u)\n")
    _, default = run_mypy([src], mypy_config(tmp_path, plugin=True, extra=_FAST),
                          tmp_path / "c1", cwd=tmp_path)
    assert "[spmd-nonlinear-unreduced]" in default and "conservative has no Unreduced rule" in default
    cfg = mypy_config(tmp_path, plugin=True, extra=_FAST + "\n[spmdtyped]\njax = 0.12")
    _, v12 = run_mypy([src], cfg, tmp_path / "c2", cwd=tmp_path)
    assert "error" not in v12, v12
    assert "SArray[Never, Literal['tp'], Never, Any]" in v12
    (tmp_path / "pyproject.toml").write_text('[tool.mypy]\nplugins = ["spmdtyped.mypy_plugin"]\n'
                                             '[tool.spmdtyped]\njax = "0.99"\n')
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml",
                           "--no-site-packages", "--ignore-missing-imports", "prog.py"],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO), MYPYPATH=str(REPO)),
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "[spmdtyped] jax = '0.99'" in proc.stdout + proc.stderr
    assert "INTERNAL ERROR" not in proc.stdout + proc.stderr
    # unquoted: TOML reads a float (0.10 would be 0.1); the plugin reads the text as written
    (tmp_path / "pyproject.toml").write_text('[tool.mypy]\nplugins = ["spmdtyped.mypy_plugin"]\n'
                                             '[tool.spmdtyped]\njax = 0.10\n')
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml",
                           "--no-site-packages", "--ignore-missing-imports", "--cache-dir",
                           str(tmp_path / "c3"), "prog.py"],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(REPO), MYPYPATH=str(REPO)),
                          capture_output=True, text=True)
    assert "INTERNAL ERROR" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "[spmd-nonlinear-unreduced]" in proc.stdout and "jax 0.10 has no Unreduced rule" in proc.stdout
