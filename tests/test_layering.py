"""The package's layers point one way: no import cycle between its modules (function-level
and TYPE_CHECKING imports count), no module imports another module's private names, the rule
table and the surface table import no JAX, and no module outgrows ~600 lines.

The import graph is read with `ast` (as `shared/tools/house_check.py` does), so a lazy import
inside a function still ties two modules together.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PKG_DIR = Path(__file__).resolve().parent.parent / "spmdtyped"
PKG = PKG_DIR.name
#: files other owners are splitting (the mypy plugin); held to the cycle rule only
SIZE_EXEMPT = {"spmdtyped.mypy_plugin"}
SIZE_EXEMPT_PREFIXES = ("spmdtyped._mypy.",)
#: modules that are allowed to reach into other modules' private names: none, except the
#: ones still being reworked by other owners (the plugin, its static view, the codemod/CLI)
PRIVATE_EXEMPT = {"spmdtyped.mypy_plugin", "spmdtyped._static", "spmdtyped.adapters._port.codemod",
                  "spmdtyped._cli.infer"}
MAX_LINES = 600


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted(PKG_DIR.rglob("*.py")):
        rel = path.relative_to(PKG_DIR.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        mods[name] = path
    return mods


MODULES = _modules()


def _resolve(mod: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
    """(module imported, name imported from it or None) for each target of an import."""
    if isinstance(node, ast.Import):
        return [(a.name, None) for a in node.names]
    base = mod.split(".")
    if node.level:
        is_pkg = MODULES[mod].name == "__init__.py"
        base = base[: len(base) - node.level + (1 if is_pkg else 0)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [(prefix, a.name) for a in node.names]


def _imports(mod: str) -> list[tuple[str, str | None, int]]:
    tree = ast.parse(MODULES[mod].read_text(), str(MODULES[mod]))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.extend((m, n, node.lineno) for m, n in _resolve(mod, node))
    return out


def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for m in MODULES:
        for target, name, _ in _imports(m):
            for t in (target, f"{target}.{name}" if name else None):
                if t in MODULES and t != m and t != PKG:
                    edges[m].add(t)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in MODULES:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


def test_cycle_detection_works() -> None:
    """The checker itself finds a cycle (so that the test above can fail)."""
    edges = {m: set(e) for m, e in _graph().items()}
    edges["spmdtyped._typed.hints"].add("spmdtyped._typed.array")
    assert any({"spmdtyped._typed.array", "spmdtyped._typed.hints"} <= set(c) for c in _cycles(edges))


def test_hints_is_below_array_and_compat() -> None:
    edges = _graph()
    assert not edges["spmdtyped._typed.hints"] & {"spmdtyped._typed.array", "spmdtyped._compat"}


def _private_imports(mod: str) -> list[str]:
    found = []
    for target, name, line in _imports(mod):
        if not target.startswith(PKG) or name is None or not name.startswith("_"):
            continue
        if name.startswith("__") or f"{target}.{name}" in MODULES:
            continue  # a dunder, or a private *module* (`from . import _compat`)
        found.append(f"{mod}:{line} imports {name} from {target}")
    # attribute access to another module's private name: `_hints._made`
    aliases = {}
    for target, name, _ in _imports(mod):
        full = f"{target}.{name}" if name else target
        if full in MODULES:
            aliases[name or target.rsplit(".", 1)[-1]] = full
    tree = ast.parse(MODULES[mod].read_text())
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and f"{aliases[node.value.id]}.{node.attr}" not in MODULES):
            found.append(f"{mod}:{node.lineno} reads {node.value.id}.{node.attr}")
    return found


def test_no_private_names_across_modules() -> None:
    found = [f for m in MODULES if m not in PRIVATE_EXEMPT for f in _private_imports(m)]
    assert found == []


@pytest.mark.parametrize("module", ["spmdtyped._rules", "spmdtyped._surface"])
def test_rule_and_surface_tables_import_no_jax(module: str) -> None:
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            f"bad = sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'mypy', "
            f"'numpy')); print(bad); sys.exit(1 if bad else 0)")
    env = {**os.environ, "PYTHONPATH": str(PKG_DIR.parent)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr


def test_no_module_over_600_lines() -> None:
    big = {m: n for m, p in MODULES.items()
           if (n := len(p.read_text().splitlines())) > MAX_LINES
           and m not in SIZE_EXEMPT and not m.startswith(SIZE_EXEMPT_PREFIXES)}
    assert big == {}


# ------------------------------------------------------------------------------ floors

#: the package's lowest floors, bottom first: a module on a floor imports only modules of its
#: own subsystem or of a floor below (everything else -- typed values, ops, the engine, the
#: faces -- stands on them). `_rules/refine` raises `_errors`' exceptions, so `_errors` is
#: the ground floor; `_surface` names `_rules`' rules; the static view reads `SpmdType`.
FLOORS: tuple[tuple[str, ...], ...] = (("_errors",), ("_rules",), ("_surface", "_static"))


def _subsystem(mod: str) -> str:
    parts = mod.split(".")
    return parts[1] if len(parts) > 1 else ""


def _floor_violations(edges: dict[str, set[str]]) -> list[str]:
    rank = {s: i for i, floor in enumerate(FLOORS) for s in floor}
    bad = []
    for m, targets in sorted(edges.items()):
        s = _subsystem(m)
        if s not in rank:
            continue
        for t in sorted(targets):
            ts = _subsystem(t)
            if ts != s and rank.get(ts, len(FLOORS)) >= rank[s]:
                bad.append(f"{m} -> {t}")
    return bad


def test_floors_import_only_downwards() -> None:
    assert _floor_violations(_graph()) == []


def test_rules_import_nothing_above_them() -> None:
    """The rule table (`_rules/`, `_rules/refine/`) imports no `_surface`, `_typed`, `_ops`,
    `_engine`, ... : only itself and `_errors` (the back-up arrow `_rules` -> `_surface` is gone)."""
    edges = _graph()
    above = sorted(f"{m} -> {t}" for m, ts in edges.items() if _subsystem(m) == "_rules"
                   for t in ts if _subsystem(t) not in ("_rules", "_errors"))
    assert above == []


def test_floor_check_works() -> None:
    """The floor check itself finds an arrow that runs back up."""
    edges = {m: set(e) for m, e in _graph().items()}
    edges["spmdtyped._rules.axes"].add("spmdtyped._surface")
    edges["spmdtyped._errors"].add("spmdtyped._rules.states")
    assert set(_floor_violations(edges)) == {"spmdtyped._rules.axes -> spmdtyped._surface",
                                             "spmdtyped._errors -> spmdtyped._rules.states"}


def _reaches(edges: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for t in edges[todo.pop()]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


def test_boundary_specs_and_shard_map_point_one_way() -> None:
    """`st.shard_map` -> `specs` (deriving specs from hints) and both -> `fields` (what a
    pytree class says about its fields); `specs` and `fields` never reach `shard_map`, and
    `fields` does not reach `specs`."""
    edges = _graph()
    specs, shard_map, fields = (f"spmdtyped._boundary.{m}" for m in ("specs", "shard_map", "fields"))
    assert {specs, fields} <= edges[shard_map]
    assert fields in edges[specs]
    assert shard_map not in _reaches(edges, specs)
    assert shard_map not in _reaches(edges, fields) and specs not in _reaches(edges, fields)
