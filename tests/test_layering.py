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
    found = [f for m in MODULES for f in _private_imports(m)]
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
    big = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}


#: the floors of the package, lowest first: a module may import its own floor and the floors
#: below it, never one above. The units are the subsystem folders and the root modules;
#: `_typed.hints` (the hint classes, no JAX) is its own unit, below `_compat`, which the rest
#: of `_typed` stands on; `_errors.jax_messages` (JAX's messages, matched against the collective
#: rows) stands above the surface table. The same list is the package README's floor plan.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("_errors",),
    ("_rules",),
    ("_surface", "_static"),
    ("_typed.hints",),
    ("_compat", "_frames"),
    ("_typed", "_engine", "_errors.jax_messages", "_validate"),
    ("numpy", "nn", "debug"),
    ("_ops",),
    ("lax", "_boundary"),
    ("adapters", "_report"),
    ("adapters._port",),
    ("_stubgen", "_mypy", "mypy_plugin", "_cli", "__main__", "spmdtyped"),
)


def _unit(mod: str) -> str:
    parts = mod.split(".")[1:]
    if not parts:
        return PKG
    if parts[:2] in (["_typed", "hints"], ["_errors", "jax_messages"]):
        return ".".join(parts[:2])
    if parts[:2] == ["adapters", "_port"]:
        return "adapters._port"
    return parts[0]


def _floor(unit: str) -> int:
    for i, names in enumerate(FLOORS):
        if unit in names:
            return i
    raise AssertionError(f"{unit} is on no floor of FLOORS: add it (and to spmdtyped/README.md)")


def _namespace(mod: str) -> bool:
    """A package whose `__init__` imports nothing (a docstring): importing one of its modules
    names it, but ties nothing to it."""
    return MODULES[mod].name == "__init__.py" and not _imports(mod)


def _upward_imports(edges: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b} (floor {_floor(_unit(a))} imports floor {_floor(_unit(b))})"
                  for a, bs in edges.items() for b in bs
                  if not _namespace(b) and _floor(_unit(b)) > _floor(_unit(a)))


def test_no_import_from_a_lower_floor_to_a_higher_one() -> None:
    assert _upward_imports(_graph()) == []


def test_floor_check_works() -> None:
    """The floor check itself finds an import that runs back up (so the test above can fail)."""
    edges = {m: set(e) for m, e in _graph().items()}
    edges["spmdtyped._rules.states"].add("spmdtyped._typed.array")
    assert any(a.startswith("spmdtyped._rules.states -> spmdtyped._typed.array")
               for a in _upward_imports(edges))


def _readme_units() -> set[str]:
    """The first-column names of the package README's floor plan table."""
    text = (PKG_DIR / "README.md").read_text()
    plan = text.split("## Floor plan", 1)[1].split("\n## ", 1)[0]
    names = set()
    for line in plan.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 3 and cells[0].startswith("`"):
            names.add(cells[0].strip("`").removesuffix("/").removesuffix(".py"))
    return names


def test_readme_floor_plan_matches_the_tree() -> None:
    """Every folder and root module of the package has its row in spmdtyped/README.md's floor
    plan (and no row names something that is gone)."""
    tree = {p.name for p in PKG_DIR.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    tree |= {p.stem for p in PKG_DIR.glob("*.py") if p.stem != "__init__"}
    tree |= {f"adapters/{p.name}" for p in (PKG_DIR / "adapters").iterdir()
             if p.is_dir() and (p / "__init__.py").exists()}
    assert _readme_units() == tree


def test_every_unit_is_on_a_floor() -> None:
    for m in MODULES:
        _floor(_unit(m))


def test_rules_import_nothing_above_them() -> None:
    """The rule table (`_rules/`, `_rules/refine/`) imports no `_surface`, `_typed`, `_ops`,
    `_engine`, ... : only itself and `_errors` (the back-up arrow `_rules` -> `_surface` is gone)."""
    edges = _graph()
    above = sorted(f"{m} -> {t}" for m, ts in edges.items() if _unit(m) == "_rules"
                   for t in ts if _unit(t) not in ("_rules", "_errors"))
    assert above == []


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
