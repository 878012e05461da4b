"""The generated pyright stub, the static view (`spmdtyped/_static.py`) and the runtime agree on
every public signature, name by name and parameter by parameter.

The stub's declarations of the public functions are rendered from `_static.py`
(`_stubgen.static`); the collectives and `axis_index` are generated per axis from the rule
table, so their overloads differ from the static view's in their annotations (a `Literal` per
axis), never in their parameters. Both files are parsed with `ast`; the runtime's signatures
are `inspect.signature`'s. A parameter is compared by name, kind and default (`...` in the
static view: a default it does not spell, e.g. JAX's `Infer` sentinel).
"""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

import pytest

import spmdtyped as st
from spmdtyped import _errors
from spmdtyped._stubgen import render
from spmdtyped._stubgen import static as stub_static

AXES = ("dp", "tp")
STUB = ast.parse(render(AXES)["spmdtyped/__init__.pyi"])
STATIC = stub_static.parse()
STUB_FUNCTIONS = stub_static.declarations(STUB)
STATIC_FUNCTIONS = stub_static.declarations(STATIC)


def _top_names(tree: ast.Module) -> set[str]:
    out = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.add(node.target.id)
        elif isinstance(node, ast.Assign):
            out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):  # `from typing import Annotated as Float`
            out |= {a.asname or a.name for a in node.names}
    return out


STUB_NAMES = _top_names(STUB)
STUB_CLASSES = {n.name: n for n in STUB.body if isinstance(n, ast.ClassDef)}


def _static_all() -> list[str]:
    """`_static.__all__` as the module spells it (a list, plus `__all__ += [...]` lines)."""
    names: list[str] = []
    for node in STATIC.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else (
            node.target if isinstance(node, ast.AugAssign) else None)
        if isinstance(target, ast.Name) and target.id == "__all__":
            names += ast.literal_eval(node.value)  # type: ignore[union-attr]
    return names


#: public names this tier leaves untyped: the stub does not declare them, its `__getattr__`
#: answers `Any` (the mypy plugin types them)
UNTYPED_IN_STUB = frozenset({
    "CustomOp", "State", "clip_by_global_norm", "cond",
    "cotangent_type", "custom_op", "global_norm", "local", "opaque", "report", "switch", "vjp",
})
#: static-view declarations for the plugin only (its hook targets), not public names
PLUGIN_ONLY = frozenset({"AxisSize", "AxisShare", "StaticSpec", "OutSpecMismatch",
                         "ShardMapDecorator", "VmapOfGrad"})
PUBLIC = sorted(set(st.__all__) | set(_static_all()))
#: functions declared in both files whose stub overloads are `_static.py`'s own
RENDERED = stub_static.FUNCTIONS
#: functions whose stub overloads are generated from the rule table
GENERATED = sorted(n for n in PUBLIC if n in STUB_FUNCTIONS and n not in RENDERED)

Param = tuple[str, str, str | None]


def params(fn: ast.FunctionDef) -> list[Param]:
    """(name, kind, default source or None) of each parameter, as `inspect.Parameter` kinds."""
    a = fn.args
    pos = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    out: list[Param] = []
    for i, (arg, d) in enumerate(zip(pos, defaults, strict=True)):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        out.append((arg.arg, kind, None if d is None else ast.unparse(d)))
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", None))
    for arg, kd in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        out.append((arg.arg, "KEYWORD_ONLY", None if kd is None else ast.unparse(kd)))
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", None))
    return out


def annotations(fn: ast.FunctionDef) -> list[str | None]:
    a = fn.args
    args = [*a.posonlyargs, *a.args, *([a.vararg] if a.vararg else []), *a.kwonlyargs,
            *([a.kwarg] if a.kwarg else [])]
    return [None if x.annotation is None else ast.unparse(x.annotation) for x in args] + [
        None if fn.returns is None else ast.unparse(fn.returns)]


def implementation(name: str) -> ast.FunctionDef:
    """`_static.py`'s signature of `name` for the runtime: its implementation (the def without
    `@overload`), or its only declaration."""
    defs = [n for n in STATIC.body if isinstance(n, ast.FunctionDef) and n.name == name]
    plain = [d for d in defs if d not in STATIC_FUNCTIONS[name] or len(defs) == 1]
    return plain[-1]


def _default(text: str) -> Any:
    return eval(text, {"frozenset": frozenset})  # noqa: S307 - a default of _static.py


# ------------------------------------------------------------------------------ every name


def test_every_public_name_is_declared_by_the_stub_or_listed_as_untyped() -> None:
    undecided = [n for n in PUBLIC if n not in STUB_NAMES and n not in UNTYPED_IN_STUB]
    assert undecided == [], f"declare these in the stub (via _static.py) or list them: {undecided}"
    stale = sorted(n for n in UNTYPED_IN_STUB if n in STUB_NAMES or n not in PUBLIC)
    assert stale == []


def test_every_static_declaration_is_public_or_for_the_plugin() -> None:
    declared = {n.name for n in STATIC.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert sorted(declared - set(PUBLIC) - PLUGIN_ONLY - {"_At", "_AtIndex"}) == []


def test_the_rendered_functions_are_the_stubs_hand_written_part() -> None:
    """Every public function the stub declares is rendered from `_static.py` or generated from
    the rule table; both lists together are the stub's functions (besides `__getattr__`)."""
    assert set(RENDERED) | set(GENERATED) == set(STUB_FUNCTIONS) - {"__getattr__"}
    assert set(RENDERED) <= set(STATIC_FUNCTIONS)


# ------------------------------------------------------------------------------ stub ~ static


@pytest.mark.parametrize("name", RENDERED)
def test_stub_declaration_is_the_static_views(name: str) -> None:
    stub, static = STUB_FUNCTIONS[name], STATIC_FUNCTIONS[name]
    assert len(stub) == len(static), f"{name}: {len(stub)} overloads in the stub, {len(static)} in _static.py"
    for k, (a, b) in enumerate(zip(stub, static, strict=True)):
        assert params(a) == params(b), f"{name} overload {k}"
        want = annotations(stub_static.stub_form(b))
        assert annotations(a) == want, f"{name} overload {k}"
        # the stub's spellings are the only difference (`_V` is `_V1`, `SArray[Any, Any, Any]`
        # results are `_Untyped`)
        for x, y in zip(annotations(a), annotations(b), strict=True):
            if x != y:
                assert (y == stub_static.UNTYPED_RESULT and x == "_Untyped") or \
                    x == re.sub(r"\b_V\b", "_V1", y), (name, x, y)


@pytest.mark.parametrize("name", GENERATED)
def test_generated_overloads_take_the_static_views_parameters(name: str) -> None:
    """A collective's (or `axis_index`'s) stub overloads: each has the static view's parameter
    names and kinds; the catch-all first one has its defaults too, the others only narrow (a
    default left out: `to="reduced"` has to be said)."""
    want = params(implementation(name))
    for k, ov in enumerate(STUB_FUNCTIONS[name]):
        got = params(ov)
        assert [(n, kind) for n, kind, _ in got] == [(n, kind) for n, kind, _ in want], f"{name} overload {k}"
        for (n, _, d), (_, _, w) in zip(got, want, strict=True):
            assert d is None or d == w, f"{name} overload {k}: {n}={d}, _static.py: {n}={w}"
    first = STUB_FUNCTIONS[name][0]
    assert params(first) == want or name == "axis_index"


def test_shard_map_defaults_are_the_runtimes() -> None:
    """The drift this test was written for: the stub required `out_specs` and `mesh`."""
    for ov in STUB_FUNCTIONS["shard_map"]:
        defaults = {n: d for n, _, d in params(ov)}
        assert defaults["out_specs"] == defaults["mesh"] == "None"
        assert defaults["in_specs"] is not None


# ------------------------------------------------------------------------------ static ~ runtime


RUNTIME_FUNCTIONS = sorted(n for n in PUBLIC if n in STATIC_FUNCTIONS)


@pytest.mark.parametrize("name", RUNTIME_FUNCTIONS)
def test_static_signature_is_the_runtimes(name: str) -> None:
    sig = inspect.signature(getattr(st, name))
    got = [(p.name, p.kind.name, p.default) for p in sig.parameters.values()]
    want = params(implementation(name))
    assert [(n, k) for n, k, _ in got] == [(n, k) for n, k, _ in want], name
    for (n, _, d), (_, _, w) in zip(got, want, strict=True):
        if w is None:
            assert d is inspect.Parameter.empty, f"{name}: {n} has a runtime default {d!r}"
        elif w == "...":
            assert d is not inspect.Parameter.empty, f"{name}: {n} has no runtime default"
        else:
            assert d == _default(w), f"{name}: {n}={d!r} at runtime, {w} in _static.py"


# ------------------------------------------------------------------------------ classes


def test_stub_error_classes_are_the_runtimes() -> None:
    for name in PUBLIC:
        cls = getattr(st, name)
        if not (isinstance(cls, type) and issubclass(cls, _errors.SpmdTypeError)):
            continue
        node = STUB_CLASSES[name]
        assert [ast.unparse(b) for b in node.bases] == [b.__name__ for b in cls.__bases__]
    root = STUB_CLASSES["SpmdTypeError"]
    attrs = {n.target.id: ast.unparse(n.annotation) for n in root.body  # type: ignore[union-attr]
             if isinstance(n, ast.AnnAssign)}
    assert attrs == {k: v for k, v in _errors.SpmdTypeError.__annotations__.items()
                     if not k.startswith("_")}
    for attr in ("code", "axes", "states", "fix"):  # DESIGN.md §3
        assert attr in attrs


def test_stub_spmd_type_is_the_runtimes() -> None:
    node = STUB_CLASSES["SpmdType"]
    fields = [n.target.id for n in node.body if isinstance(n, ast.AnnAssign)]  # type: ignore[union-attr]
    assert fields == ["varying", "unreduced", "reduced", "unreduced_kind"]
    init = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    sig = inspect.signature(st.SpmdType)
    got = [(p.name, p.kind.name, p.default) for p in sig.parameters.values()]
    want = params(init)[1:]  # without self
    assert [(n, k) for n, k, _ in got] == [(n, k) for n, k, _ in want]
    assert [d for _, _, d in got] == [_default(w) for _, _, w in want]  # type: ignore[arg-type]
    assert all(hasattr(st.SpmdType(), f) for f in fields)
