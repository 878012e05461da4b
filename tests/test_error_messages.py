"""The error catalogue's pages and the messages built from them: every code has a headline,
a one-sentence rule, a fix and a wrong/fixed code pair; a message names the code, the rule, the
fix and (inside `st.shard_map`) the user's function and mesh; `explain` takes every spelling of
a code; the CLI survives a closed pipe."""

from __future__ import annotations

import ast
import dataclasses
import linecache
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from _helpers import trace
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import _compat, _errors
from spmdtyped._errors import pages as _error_pages

ROOT = Path(__file__).resolve().parent.parent
CODES = sorted(_errors.REGISTRY)


# ----------------------------------------------------------------------------- the pages


@pytest.mark.parametrize("code", CODES)
def test_every_page_has_headline_rule_fix_before_after(code: str) -> None:
    e = _errors.REGISTRY[code]
    assert e.code == code and e.mypy_code == f"spmd-{e.slug}"
    for name in ("title", "headline", "rule", "meaning", "fix", "before", "after", "when"):
        assert getattr(e, name).strip(), (code, name)
    assert e.solutions and all(s.strip() for s in e.solutions)
    # the rule is ONE explicit sentence of its own, not the first sentence of `meaning`
    assert e.rule.endswith(".") and e.rule[0].isupper(), e.rule
    assert ". " not in e.rule.rstrip("."), e.rule
    assert not e.meaning.startswith(e.rule.rstrip(".")), code
    # the wrong code and the fixed code are two different Python programs
    assert e.before.strip() != e.after.strip()
    ast.parse(e.before)
    ast.parse(e.after)
    assert all(r in _errors.REGISTRY and r != code for r in e.related)


@pytest.mark.parametrize("code", CODES)
def test_explain_page_shows_rule_fix_then_wrong_then_fixed_code(code: str) -> None:
    e = _errors.REGISTRY[code]
    page = st.explain(code)
    assert page.startswith(f"# {code}: {e.title}\n")
    assert f"{e.headline[0].upper()}{e.headline[1:]}." in page
    assert f"**Rule:** {e.rule}" in page
    wrong = page.index(f"```python\n{e.before}\n```")
    fixed = page.index(f"```python\n{e.after}\n```")
    assert page.index(f"Wrong (raises {code})") < wrong < page.index("Fixed:") < fixed
    assert f"```python\n{e.fix}\n```" in page
    assert (f"with st.allow({code!r})" in page) == e.opt_out


def test_category_follows_the_hundreds_digit() -> None:
    for code, e in _errors.REGISTRY.items():
        assert e.category is _errors.CATEGORIES[code[4]]
        assert code[4] in (e.category.__doc__ or "").rsplit("SPMD", 1)[-1][:1]


def test_pages_are_built_by_keyword_only_and_frozen() -> None:
    e = _errors.REGISTRY["SPMD101"]
    fields = {f.name: getattr(e, f.name) for f in dataclasses.fields(e)}
    with pytest.raises(TypeError):
        _error_pages.ErrorPage(*fields.values())  # type: ignore[misc]
    assert _error_pages.ErrorPage(**fields).rule == e.rule
    with pytest.raises(dataclasses.FrozenInstanceError):
        e.rule = "x"  # type: ignore[misc]


def test_every_code_is_one_registry_entry() -> None:
    slugs = [e.slug for e in _errors.REGISTRY.values()]
    titles = [e.title for e in _errors.REGISTRY.values()]
    assert len(set(slugs)) == len(slugs) and len(set(titles)) == len(titles)
    assert list(_errors.REGISTRY) == CODES  # catalogue order is code order


# ----------------------------------------------------------------------------- messages


@pytest.mark.parametrize("code", CODES)
def test_rendered_message_has_code_rule_and_fix(code: str) -> None:
    e = _errors.REGISTRY[code]
    err = _errors.error(code, "st.example: something went wrong", op="st.example")
    msg = str(err)
    assert msg.splitlines()[0] == f"st.example: something went wrong  [{code}]"
    assert f"  rule: {e.rule}" in msg
    assert f"  fix (example): {e.fix}" in msg  # the page's fix when the raising API gives none
    assert f"errors/{code}/" in msg and f"explain {code}" in msg
    own = _errors.error(code, "st.example: x", op="st.example", fix="st.psum(y, 'dp')")
    assert "  fix: st.psum(y, 'dp')" in str(own) and e.fix not in str(own)
    assert type(err) is e.category and err.function is None and err.mesh is None


def test_error_inside_shard_map_names_the_function_and_the_mesh(mesh_dp_tp: Any) -> None:
    def mlp(x: Any) -> Any:
        return st.psum(st.pcast(x, "tp", to="reduced"), "tp")

    with pytest.raises(st.AxisStateError) as info:
        trace(mesh_dp_tp, mlp, P("dp"), P("dp"))
    e = info.value
    first = str(e).splitlines()[0]
    assert first.startswith("st.psum over 'tp' in mlp (mesh dp=2, tp=4): ")
    assert first.endswith("[SPMD101]")
    assert e.function == "mlp" and e.mesh == "dp=2, tp=4"
    assert "in mlp" not in e.headline  # what the mypy plugin prints stays the API's own line
    assert f"rule: {_errors.REGISTRY['SPMD101'].rule}" in str(e)
    assert "fix: " in str(e)


def test_elementwise_and_output_errors_name_the_function(mesh_dp_tp: Any) -> None:
    def block(x: Any) -> Any:
        return st.numpy.tanh(st.pcast(st.pvary(x, "tp"), "tp", to="unreduced"))

    with pytest.raises(st.CombineError) as info:
        trace(mesh_dp_tp, block, P("dp"), P("dp"))
    assert "st.numpy.tanh in block (mesh dp=2, tp=4): " in str(info.value)

    def leak(x: Any) -> Any:
        return x

    with pytest.raises(st.BoundaryError) as out:
        trace(mesh_dp_tp, leak, P("dp"), P())
    # the headline already names the function: only the mesh is added
    assert str(out.value).startswith("st.shard_map(leak) (mesh dp=2, tp=4): ")


def test_partial_manual_mesh_names_its_manual_axes(mesh_dp_tp: Any) -> None:
    def body(x: Any) -> Any:
        return st.psum(x, "tpp")

    with pytest.raises(st.UsageError) as info:
        trace(mesh_dp_tp, body, P(), P(), axis_names={"tp"})
    assert "in body (mesh dp=2, tp=4; manual: tp)" in str(info.value).splitlines()[0]


def test_typed_shard_map_names_the_function_and_the_mesh(mesh_dp_tp: Any) -> None:
    def double_sum(x: Any) -> Any:
        return jax.lax.psum(jax.lax.psum(x, "tp"), "tp")

    x = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh_dp_tp, P("dp")))
    f = st.adapters.typed_shard_map(double_sum, mesh=mesh_dp_tp, in_specs=P("dp"), out_specs=P("dp"))
    with pytest.raises(st.AxisStateError) as info:
        f(x)
    assert info.value.code == "SPMD103"
    assert "in double_sum (mesh dp=2, tp=4): " in str(info.value).splitlines()[0]


def test_no_context_outside_shard_map_and_after_it(mesh_dp_tp: Any) -> None:
    with pytest.raises(st.UsageError) as info:
        st.psum(jnp.ones(3), "dp")
    assert info.value.function is None and " (mesh " not in str(info.value)
    with pytest.raises(st.SpmdTypeError):
        trace(mesh_dp_tp, lambda x: st.psum(st.pcast(x, "tp", to="reduced"), "tp"), P("dp"), P("dp"))
    assert _errors.error("SPMD501", "st.psum: 'k' is not an axis", op="st.psum").function is None


def test_error_context_nests_and_decorates() -> None:
    with _errors.error_context(function="outer", mesh={"dp": 2}):
        with _errors.error_context(function="inner", mesh="ep=8"):
            inner = _errors.error("SPMD501", "st.psum: 'k' is not an axis", op="st.psum")
        outer = _errors.error("SPMD501", "st.psum: 'k' is not an axis", op="st.psum")
    assert str(inner).startswith("st.psum in inner (mesh ep=8): ")
    assert str(outer).startswith("st.psum in outer (mesh dp=2): ")

    @_errors.error_context(function="step", mesh={"fsdp": 4})
    def step() -> Any:
        return _errors.error("SPMD504", "Varying[...] needs at least one axis")

    # a headline without the API's prefix gets the context on a line of its own
    assert str(step()).splitlines()[1] == "  in step (mesh fsdp=4)"


# ----------------------------------------------------------------------------- explain


@pytest.mark.parametrize("spelling", ["SPMD101", "spmd101", " Spmd101 ", 101, "101",
                                      "spmd-reduced-operand", "reduced-operand"])
def test_explain_spellings(spelling: Any) -> None:
    assert st.explain(spelling) == st.explain("SPMD101")


@pytest.mark.parametrize("bad, suggestion", [
    ("SPMD999", None), ("SPMD1O1", "SPMD101"), ("reduced-operant", "SPMD101"),
    ("spmd-unknown-axs", "SPMD501"), (999, None), (3.5, None), (None, None), (True, None),
])
def test_explain_unknown_is_a_usage_error_with_a_suggestion(bad: Any, suggestion: str | None) -> None:
    with pytest.raises(st.UsageError) as info:
        st.explain(bad)
    assert info.value.code == "SPMD508"
    if suggestion is not None:
        assert f"did you mean {suggestion!r}" in str(info.value)


def test_allow_takes_the_same_spellings() -> None:
    with st.allow(103, "spmd-nonlinear-unreduced"):
        assert _errors.allowed("SPMD103") and _errors.allowed("SPMD202")
        assert _errors.allowed_codes() == {"SPMD103", "SPMD202"}
    assert not _errors.allowed("SPMD103")
    with pytest.raises(st.UsageError, match="SPMD508"):
        with st.allow("SPMD1O3"):
            pass


# ----------------------------------------------------------------------------- the CLI


def _cli(*args: str, closed_pipe: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not closed_pipe:
        return subprocess.run([sys.executable, "-m", "spmdtyped", "explain", *args], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=120)
    # `explain ... | head -0`, without the race: the reading end is closed before the child writes
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([sys.executable, "-m", "spmdtyped", "explain", *args], cwd=ROOT,
                              env=env, stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)


@pytest.mark.parametrize("args", [("SPMD101",), ()], ids=["page", "list"])
def test_cli_explain_survives_a_closed_pipe(args: tuple[str, ...]) -> None:
    proc = _cli(*args, closed_pipe=True)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr


def test_cli_explain_spellings_and_unknown_code() -> None:
    ok = _cli("spmd-reduced-operand")
    assert ok.returncode == 0 and ok.stdout.startswith("# SPMD101: ")
    bad = _cli("SPMD1O1")
    assert bad.returncode == 2 and "did you mean 'SPMD101'" in bad.stderr
    assert "Traceback" not in bad.stderr


# ----------------------------------------------------------------------------- wrong and fixed code

# How each page's two programs run: "body" snippets run inside an `st.shard_map` body on the
# dp=2 x tp=4 mesh with the names of `given` bound to per-device values in those states (then
# `setup` runs), "top" snippets run at top level with `x` (sharded P("dp")) and `b` (replicated)
# global arrays and `setup`. The wrong code must raise the page's code, the fixed code nothing.
EXAMPLES: dict[str, tuple[str, dict[str, str], str]] = {
    "SPMD101": ("body", {"w_shard": "V:dp"}, ""),
    "SPMD102": ("body", {"partial": "U:tp"}, ""),
    "SPMD103": ("body", {"w": "I", "xb": "V:dp"}, "loss = lambda w: (xb * w).sum()"),
    "SPMD104": ("body", {"x": "V:dp"}, ""),
    "SPMD105": ("body", {"x": "V:dp U:tp"}, ""),
    "SPMD106": ("body", {"partial_sums": "U:tp"}, ""),
    "SPMD107": ("body", {"w": "I"}, ""),
    "SPMD108": ("body", {"w_experts": "S:tp:0"}, ""),
    "SPMD201": ("body", {"u": "U:tp", "bias": "I"}, ""),
    "SPMD202": ("body", {"u": "U:tp"}, ""),
    "SPMD203": ("body", {"w": "R:dp", "scale": "I"}, ""),
    "SPMD204": ("body", {"a": "R:dp", "b": "R:tp"}, ""),
    "SPMD205": ("body", {"x": "V:dp,tp", "w": "R:dp"}, ""),
    "SPMD210": ("body", {"h": "S:tp:-1", "w2": "S:tp:0", "b": "I"}, ""),
    "SPMD211": ("body", {"h": "S:tp:-1", "w2": "S:tp:0"}, ""),
    "SPMD212": ("body", {"l": "S:dp:0", "mask": "S:dp:0"}, ""),
    "SPMD213": ("body", {"x": "V:tp", "p": "P:tp"}, ""),
    "SPMD215": ("body", {"q_heads": "S:tp:-2", "sinks": "I", "sinks_local": "S:tp:-2"}, "h = 8"),
    "SPMD216": ("top", {}, "import numpy as np\n"
                "mesh = jax.make_mesh((2, 4), ('dp', 'sp'))\n"
                "q, k, v = (jax.device_put(np.linspace(-1, 1, 256, dtype=np.float32)"
                ".reshape(2, 16, 8) * s, jax.sharding.NamedSharding(mesh, P('dp', 'sp'))) "
                "for s in (1.0, -0.5, 2.0))"),
    "SPMD301": ("body", {"u": "U:tp"}, ""),
    "SPMD302": ("body", {"acc0": "U:tp"}, "n = 3\npart = lambda i: acc0 * 2.0"),
    "SPMD303": ("top", {}, ""),
    "SPMD401": ("top", {}, "f = lambda x: x"),
    "SPMD402": ("top", {}, "f = lambda x, b: st.psum(x.sum(0), 'dp') * b"),
    "SPMD403": ("top", {}, "f = lambda x: x"),
    "SPMD404": ("body", {"w": "V:tp"}, "f = lambda w: st.pcast(w, 'tp', to='unreduced')"),
    "SPMD405": ("body", {"w": "V:tp"},
                "partial_loss = lambda w: st.pcast(w, 'tp', to='unreduced').sum()"),
    "SPMD406": ("body", {"w": "R:dp", "x": "V:dp"}, "n = 2"),
    "SPMD407": ("body", {"w": "I", "xb": "V:dp"}, ""),
    "SPMD408": ("top", {}, "import numpy as np\ng = jnp.ones((8,))"),
    "SPMD409": ("top", {}, ""),
    "SPMD410": ("top", {}, "import numpy as np\n"
                "w = jnp.asarray(np.linspace(-1, 1, 32, dtype=np.float32).reshape(8, 4))\n"
                "x = jax.device_put(jnp.asarray(np.linspace(-2, 2, 64, dtype=np.float32)"
                ".reshape(8, 8)), jax.sharding.NamedSharding(mesh, P('dp')))"),
    "SPMD411": ("top", {}, "import numpy as np\n"
                "put = lambda a, s: jax.device_put(a, jax.sharding.NamedSharding(mesh, s))\n"
                "w1 = put(np.linspace(-1, 1, 128, dtype=np.float32).reshape(8, 16), P(None, 'tp'))\n"
                "w2 = put(np.linspace(-1, 1, 64, dtype=np.float32).reshape(16, 4), P('tp', None))\n"
                "x = jnp.asarray(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))"),
    "SPMD412": ("top", {}, "import numpy as np\n"
                "put = lambda a, s: jax.device_put(a, jax.sharding.NamedSharding(mesh, s))\n"
                "w1 = put(np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 8, 16), "
                "P(None, None, 'tp'))\n"
                "w2 = put(np.linspace(-1, 1, 256, dtype=np.float32).reshape(2, 16, 8), "
                "P(None, 'tp', None))\n"
                "x = jnp.asarray(np.linspace(-2, 2, 64, dtype=np.float32).reshape(8, 8))"),
    "SPMD501": ("body", {"x": "V:tp"}, ""),
    "SPMD502": ("body", {"x": "V:dp,tp"}, ""),
    "SPMD503": ("top", {}, ""),
    # the communication report's flags (st.report(...).check())
    "SPMD701": ("top", {}, "w = jnp.ones((8, 4))\nxs = jax.device_put(jnp.ones((4, 8, 8)), jax.sharding.NamedSharding(mesh, P(None, 'dp')))"),
    "SPMD702": ("top", {}, ""), "SPMD703": ("top", {}, "import numpy as np"),
    "SPMD704": ("top", {}, ""), "SPMD705": ("top", {}, "w = jnp.ones((8, 4))"),
    "SPMD504": ("top", {}, ""),
    "SPMD505": ("body", {"x": "V:dp"}, ""),
    "SPMD506": ("top", {}, ""),
    "SPMD507": ("top", {}, ""),
    "SPMD508": ("top", {}, ""),
    "SPMD509": ("top", {}, ""),
    "SPMD901": ("body", {"x": "V:dp"}, "perm = [(0, 1), (1, 0)]"),
    "SPMD902": ("body", {"x": "I"}, ""),
}


def _in_state(v: Any, spec: str) -> Any:
    """`v` (Invariant) brought to `spec`: "I", "V:dp,tp", "R:dp", "U:tp", or several; the
    refinements of Varying: "S:tp:-1" (a Shard over tp along dim -1; dims from the left are
    resolved against the rank), "P:tp" (partial sums over tp)."""
    from spmdtyped._rules import refine
    from spmdtyped._typed import array as _array

    for part in spec.split():
        if part == "I":
            continue
        kind, axes = part.split(":", 1)
        if kind in ("S", "P"):
            axis, _, dim = axes.partition(":")
            k = refine.Shard(refine.neg_dim(int(dim), v.ndim)) if kind == "S" else refine.PARTIAL
            v = st.pvary(v, axis)
            ref = refine.Refinement.of({**_array.refinement_of(v).as_dict(), axis: k}, data=True)
            v = _array.with_refinement(v, ref)
            continue
        for axis in axes.split(","):
            if kind == "V":  # plain Varying: a pvary is Rep (equal everywhere), forget that
                v = st.pvary(v, axis)
                ref = _array.refinement_of(v).as_dict()
                ref.pop(axis, None)
                v = _array.with_refinement(v, refine.Refinement.of(ref, data=True))
            elif kind == "R":
                v = st.pcast(v, axis, to="reduced")
            else:
                v = st.pcast(st.pvary(v, axis), axis, to="unreduced")
    return v


def _compile(source: str, name: str = "example") -> Any:
    """The page's code compiled as a user's file is (a real path, its lines in `linecache`):
    the engine locates a violation at a user's line, and reads a gradient's primals there.
    Not this file's `from __future__ import annotations`: hints are evaluated as a user's are."""
    path = os.path.join(tempfile.gettempdir(), f"spmdtyped_page_{name}_{os.getpid()}.py")
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    return compile(source, path, "exec", dont_inherit=True)


def _run_example(mesh: Any, code: str, source: str) -> None:
    kind, given, setup = EXAMPLES[code]
    ns: dict[str, Any] = {"st": st, "jax": jax, "jnp": jnp, "P": P, "mesh": mesh}
    if kind == "top":
        ns["x"] = jax.device_put(jnp.ones((8, 8)), NamedSharding(mesh, P("dp")))
        ns["b"] = jax.device_put(jnp.ones(()), NamedSharding(mesh, P()))
        exec(_compile(setup + "\n" + source), ns)
        return

    def body(v: Any) -> Any:
        ns.update({name: _in_state(v, spec) for name, spec in given.items()})
        exec(_compile(setup + "\n" + source), ns)
        return jnp.zeros(())

    arg = jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=NamedSharding(mesh, P()))
    jax.jit(st.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P())).trace(arg)


def test_every_code_has_an_example() -> None:
    assert sorted(EXAMPLES) == CODES


@pytest.mark.parametrize("code", CODES)
def test_wrong_code_raises_its_code_and_fixed_code_runs(mesh_dp_tp: Any, code: str, monkeypatch: Any) -> None:
    e = _errors.REGISTRY[code]
    if code == "SPMD406" and _compat.FEATURES.loop_transposes_reduced:
        pytest.skip("jax 0.12.1 differentiates loops over Reduced values: SPMD406 is not raised")
    if code == "SPMD901":  # a JAX whose rules changed: the rule table's ppermute is made wrong
        from spmdtyped import _rules

        rule = _rules.AXIS_OPS["ppermute"]
        monkeypatch.setitem(_rules.AXIS_OPS, "ppermute", dataclasses.replace(
            rule, on={**rule.on, _rules.State.VARYING: _rules.State.INVARIANT}))
    with pytest.raises(st.SpmdTypeError) as info:
        _run_example(mesh_dp_tp, code, e.before)
    assert info.value.code == code, str(info.value)
    _run_example(mesh_dp_tp, code, e.after)
