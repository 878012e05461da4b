"""One row per collective: the collective table (`_surface.collectives`) is all the package
reads about a collective.

- A test-only row registered in a fixture (`psum_twin`: JAX's psum under a new name, its rule
  `AXIS_OPS["psum"]`) is seen by the runtime (`st.psum_twin`), `spmdtyped.lax`, the stub
  generator and the mypy plugin, and is gone once the fixture ends.
- The declarations type checkers read (they cannot iterate the table): `_static.py` and
  `spmdtyped.lax`'s `TYPE_CHECKING` block agree with the rows, and the runtime functions have
  the rows' signatures, which are JAX's.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
import spmdtyped.lax as slax
from spmdtyped import _stubgen, _surface
from spmdtyped._mypy import collectives as mypy_collectives
from spmdtyped._ops import collectives as ops_collectives
from spmdtyped._stubgen import forms as stub_forms
from spmdtyped._surface import REQUIRED, Collective, Param

REPO = Path(__file__).resolve().parent.parent
PKG = REPO / "spmdtyped"

TWIN = Collective(
    "psum_twin", ("psum",), "jax.lax.psum", (Param("axis_index_groups", "None", None, keyword=True),),
    tree_bind=True, doc="Test-only: `jax.lax.psum` under another name (the rule of `st.psum`).")


@pytest.fixture
def twin() -> Iterator[Collective]:
    with _surface.registered(TWIN):
        yield TWIN
    _assert_gone(TWIN.name)


def _assert_gone(name: str) -> None:
    assert _surface.collective(name) is None
    for module in (st, ops_collectives, slax):
        with pytest.raises(AttributeError):
            getattr(module, name)
    assert mypy_collectives.name_of(f"spmdtyped._static.{name}") is None
    assert mypy_collectives.lax_name_of(f"spmdtyped.lax.{name}") is None
    assert name not in {f.name for f in stub_forms._forms()}  # the stub's forms: not rendered again


# ------------------------------------------------------------------------ a row is enough


def test_runtime_knows_a_registered_row(twin: Collective, mesh_dp_tp: Any) -> None:
    assert inspect.signature(st.psum_twin) == inspect.signature(st.psum)  # type: ignore[attr-defined]
    assert st.psum_twin.__doc__ == twin.doc  # type: ignore[attr-defined]

    def body(x: Any) -> Any:
        y = st.psum_twin(x, "tp")  # type: ignore[attr-defined]
        assert st.typeof(y) == st.typeof(st.psum(x, "tp"))
        with pytest.raises(st.SpmdTypeError) as err:  # the rule: summing a sum again
            st.psum_twin(y, "tp")  # type: ignore[attr-defined]
        assert err.value.code == "SPMD103" and "st.psum_twin" in str(err.value)
        return y.raw

    x = jax.device_put(jnp.arange(16.0).reshape(4, 4), NamedSharding(mesh_dp_tp, P("dp", "tp")))
    out = st.shard_map(body, mesh=mesh_dp_tp, in_specs=P("dp", "tp"), out_specs=P("dp"))(x)
    ref = jax.shard_map(lambda v: jax.lax.psum(v, "tp"), mesh=mesh_dp_tp, in_specs=P("dp", "tp"),
                        out_specs=P("dp"))(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_lax_knows_a_registered_row(twin: Collective, mesh_dp_tp: Any) -> None:
    assert inspect.signature(slax.psum_twin) == inspect.signature(jax.lax.psum)  # type: ignore[attr-defined]

    def ok(v: Any) -> Any:
        return slax.psum_twin({"a": v, "b": v * 2}, "tp")["a"]  # type: ignore[attr-defined]

    def twice(v: Any) -> Any:
        return slax.psum_twin(slax.psum_twin(v, "tp"), "tp")  # type: ignore[attr-defined]

    x = jax.device_put(jnp.arange(16.0).reshape(4, 4), NamedSharding(mesh_dp_tp, P("dp", "tp")))
    run = lambda f: jax.shard_map(f, mesh=mesh_dp_tp, in_specs=P("dp", "tp"),  # noqa: E731
                                  out_specs=P("dp"))(x)
    np.testing.assert_array_equal(np.asarray(run(ok)),
                                  np.asarray(run(lambda v: jax.lax.psum(v, "tp"))))
    with pytest.raises(st.SpmdTypeError) as err:
        run(twice)
    assert err.value.code == "SPMD103"


def test_stub_knows_a_registered_row(twin: Collective) -> None:
    stub = _stubgen.render(("tp",))["spmdtyped/__init__.pyi"]  # one axis: a quick render
    lines = [ln for ln in stub.splitlines() if ln.startswith("def psum_twin(")]
    psum = [ln for ln in stub.splitlines() if ln.startswith("def psum(")]
    # the same overloads as psum's (same rule, same signature), under the new name
    assert lines and [ln.replace("psum_twin", "psum") for ln in lines] == psum
    assert any('axis_name: Literal["tp"]' in ln for ln in lines)


def _static_declaration(c: Collective) -> str:
    """A row's declaration in `_static.py`, as the static view writes one (what a test of the
    static view asks for when a row has none)."""
    sig = c.signature().replace("(x, axis_name", "(x: {x}, axis_name: AxisName", 1)
    return (f"\n\n@overload\ndef {c.name}{sig.format(x='_Input')} -> _Typed: ...\n"
            f"@overload\ndef {c.name}{sig.format(x='Any')} -> Any: ...\n"
            f"def {c.name}{sig.format(x='Any')} -> Any:\n    \"\"\"{c.doc}\"\"\"\n    ...\n"
            f"__all__ += [{c.name!r}]\n")


#: the package copy mypy reads (a stable path: one mypy cache for it across runs)
_COPY = Path(tempfile.gettempdir()) / (
    f"spmdtyped-collective-row-{hashlib.sha1(str(REPO).encode()).hexdigest()[:8]}"
    f"-py{sys.version_info[0]}{sys.version_info[1]}")


def _mypy(tmp_path: Path, source: str, declarations: str) -> str:
    """mypy with the plugin, in this process (the plugin reads the table this test extended),
    on `source`, against a copy of the package whose static view has `declarations` added."""
    api = pytest.importorskip("mypy.api")
    dest = _COPY / "spmdtyped"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(PKG, dest, ignore=shutil.ignore_patterns("__pycache__"))
    static = dest / "_static.py"
    static.write_text(static.read_text() + declarations)
    cfg = tmp_path / "mypy.ini"
    cfg.write_text(f"[mypy]\nplugins = spmdtyped.mypy_plugin\nmypy_path = {_COPY}\n"
                   "show_error_codes = True\n[mypy-spmdtyped.*]\nignore_errors = True\n")
    src = tmp_path / "uses_twin.py"
    src.write_text(source)
    cache = _COPY.with_name(_COPY.name + "-cache")
    out, err, rc = api.run(["--config-file", str(cfg), "--cache-dir", str(cache),
                            "--no-error-summary", str(src)])
    assert rc in (0, 1) and "INTERNAL ERROR" not in out + err, out + err
    return out


_SOURCE = '''\
import spmdtyped as st
from spmdtyped import Varying


def f(x: Varying["dp", "tp"]) -> None:
    y = st.psum_twin(x, "tp")
    reveal_type(y)
    st.psum_twin(y, "tp")
'''


def test_plugin_knows_a_registered_row(twin: Collective, tmp_path: Path) -> None:
    out = _mypy(tmp_path, _SOURCE, _static_declaration(twin))
    reveal = [ln for ln in out.splitlines() if ":7: note: Revealed type" in ln]
    # the plugin's result is psum's: Varying on dp only
    assert reveal and "SArray[Literal['dp'], Never, Never" in reveal[0], out
    assert ":8: error:" in out and "[spmd-invariant-operand]" in out, out


# ------------------------------------------------------------ declarations agree with rows


def _functions(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    """The last (implementation) `def` of each name, module level or under `if TYPE_CHECKING`."""
    out: dict[str, ast.FunctionDef] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            out[node.name] = node
    return out


def _params(fn: ast.FunctionDef) -> list[tuple[str, bool, str, object]]:
    """(name, keyword-only, annotation, default) after `(x, axis_name)`."""
    a = fn.args
    pos = a.posonlyargs + a.args
    pos_defaults: list[object] = [REQUIRED] * (len(pos) - len(a.defaults)) + [
        ast.literal_eval(d) for d in a.defaults]
    kw_defaults = [REQUIRED if d is None else ast.literal_eval(d) for d in a.kw_defaults]
    out = [(p.arg, False, ast.unparse(p.annotation) if p.annotation else "", d)
           for p, d in zip(pos, pos_defaults, strict=True)]
    out += [(p.arg, True, ast.unparse(p.annotation) if p.annotation else "", d)
            for p, d in zip(a.kwonlyargs, kw_defaults, strict=True)]
    return out


def _row_params(c: Collective, none_is: str = "None") -> list[tuple[str, bool, str, object]]:
    head = [("x", False, "", REQUIRED)] if c.ops else []
    head.append(("axis_name", False, "AxisName", REQUIRED))
    return head + [(p.name, p.keyword, none_is if p.annotation == "None" else p.annotation,
                    p.default) for p in c.params]


@pytest.mark.parametrize("c", _surface.COLLECTIVES, ids=lambda c: c.name)
def test_static_view_declares_each_row(c: Collective) -> None:
    """`_static.py` declares `st.<name>` with the row's parameters (the implementation `def`
    after the overloads), and exports it."""
    tree = ast.parse((PKG / "_static.py").read_text())
    fn = _functions(tree).get(c.name)
    assert fn is not None, f"_static.py lacks {c.name}; add:{_static_declaration(c)}"
    got = _params(fn)
    if c.ops:
        got[0] = ("x", False, "", REQUIRED)  # `x: Any` / `_Input`: the overloads type it
    assert got == _row_params(c), f"_static.py's {c.name} differs from its row; write:" \
                                  f"{_static_declaration(c)}"
    exported = {e.value for n in ast.walk(tree) if isinstance(n, (ast.List,))
                for e in n.elts if isinstance(e, ast.Constant)}
    assert c.name in exported


@pytest.mark.parametrize("c", [c for c in _surface.COLLECTIVES if c.in_lax], ids=lambda c: c.name)
def test_lax_declares_each_row(c: Collective) -> None:
    """`spmdtyped.lax`'s `TYPE_CHECKING` declarations have the row's parameters (raw values:
    `Any` where the row says `None`, JAX accepts groups there)."""
    tree = ast.parse((PKG / "lax.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and ast.unparse(n.test) == "TYPE_CHECKING" and any(
                     isinstance(s, ast.FunctionDef) for s in n.body))
    fn = _functions(block).get(c.name)
    assert fn is not None, f"spmdtyped/lax.py's TYPE_CHECKING block lacks {c.name}"
    got = _params(fn)
    if c.ops:
        got[0] = ("x", False, "", REQUIRED)
    assert got == _row_params(c, none_is="Any")


@pytest.mark.parametrize("c", _surface.COLLECTIVES, ids=lambda c: c.name)
def test_runtime_signatures_are_the_rows_and_jaxs(c: Collective) -> None:
    want = [(n, kw, d) for n, kw, _, d in _row_params(c)]

    def of(fn: Any) -> list[tuple[str, bool, object]]:
        return [(p.name, p.kind is inspect.Parameter.KEYWORD_ONLY,
                 REQUIRED if p.default is inspect.Parameter.empty else p.default)
                for p in inspect.signature(fn).parameters.values()]

    assert of(getattr(st, c.name)) == want
    if c.in_lax:
        assert of(getattr(slax, c.name)) == want
        assert of(getattr(jax.lax, c.name)) == want  # JAX's order, keywords and defaults


def test_rows_are_well_formed() -> None:
    for c in _surface.COLLECTIVES:
        _surface.collectives.check(c)
    assert set(_surface.AXIS_PRIMITIVES.values()) <= set(st._rules.AXIS_OPS)
    with pytest.raises(AssertionError):  # a name is registered once
        with _surface.registered(_surface.collective("psum")):  # type: ignore[arg-type]
            pass
    assert _surface.collective("psum") is _surface.COLLECTIVES[0]
