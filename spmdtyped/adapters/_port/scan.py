"""`port`'s first pass: what a module binds (jax.lax / jax.numpy / shard_map names, module
constants) and which functions it gives to shard_map with which literal specs; the hint a
literal PartitionSpec determines. libcst only; imports no JAX."""

from __future__ import annotations

import ast
import re
from typing import Any

import libcst as cst
from libcst.metadata import PositionProvider

from spmdtyped import _rules, _surface  # plain data; imports no JAX

#: the collectives `spmdtyped.lax` checks: the surface table's (`_surface.LAX_NAMES`)
CHECKED = _surface.LAX_NAMES

SHARD_MAP_MODULES = ("jax", "jax.experimental.shard_map")
SPEC_NAMES = ("P", "PartitionSpec")


def dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def module_name(node: cst.BaseExpression | None) -> str | None:
    return None if node is None else dotted(node)


def code_of(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


# ------------------------------------------------------------------- specs -> hints


def spec_hint(node: cst.BaseExpression, consts: dict[str, cst.BaseExpression],
               used: set[str], depth: int = 0) -> str | None:
    """The hint a literal in_spec/out_spec determines, or None when it is not literal."""
    if isinstance(node, cst.Name) and node.value in consts and depth < 4:
        return spec_hint(consts[node.value], consts, used, depth + 1)
    if isinstance(node, cst.Name) and node.value == "None":
        used.add("Invariant")
        return "Invariant"
    if isinstance(node, (cst.Tuple, cst.List)):
        parts = [spec_hint(e.value, consts, used, depth) for e in node.elements]
        known = [p for p in parts if p is not None]
        if len(known) != len(parts):
            return None
        return f"tuple[{', '.join(known)}]"
    if not isinstance(node, cst.Call):
        return None
    fname = dotted(node.func) or ""
    if fname.split(".")[-1] not in SPEC_NAMES:
        return None
    varying: list[str] = []
    sets: dict[str, list[str]] = {"unreduced": [], "reduced": []}
    try:
        for arg in node.args:
            value = ast.literal_eval(code_of(arg.value))
            if arg.keyword is not None:
                key = arg.keyword.value
                if key not in sets:
                    return None
                sets[key] = sorted([value] if isinstance(value, str) else value)
            elif isinstance(value, str):
                varying.append(value)
            elif isinstance(value, tuple):
                varying.extend(value)
            elif value is not None:
                return None
    except (ValueError, SyntaxError):
        return None
    t = _rules.SpmdType(frozenset(varying), frozenset(sets["unreduced"]),
                        frozenset(sets["reduced"]))
    text = _rules.hint_text(t, varying)  # THE renderer; the spec's own axis order first
    used.update(n for n in ("Varying", "Unreduced", "Reduced", "Typed", "Invariant")
                if f"{n}[" in text or text == n)
    return text


# ------------------------------------------------------------------- pass 1: find shard_maps


class Collect(cst.CSTVisitor):
    def __init__(self) -> None:
        self.shard_map_names: set[str] = {"jax.shard_map", "jax.experimental.shard_map.shard_map"}
        self.consts: dict[str, cst.BaseExpression] = {}
        #: function name -> (in_specs, out_specs) nodes
        self.targets: dict[str, tuple[cst.BaseExpression, cst.BaseExpression]] = {}
        self.decorated: dict[int, tuple[cst.BaseExpression, cst.BaseExpression]] = {}
        self.st_alias: str | None = None
        #: dotted names bound to jax.numpy / jax.nn (`jnp`, `jax.numpy`, `nn`, `jax.nn`)
        self.numpy_names: set[str] = {"jax.numpy"}
        self.nn_names: set[str] = {"jax.nn"}
        #: names bound to (spmdtyped's, after porting) lax modules / checked collectives
        self.lax_names: set[str] = {"jax.lax", "spmdtyped.lax"}
        self.collective_names: set[str] = set()
        #: alias -> collective name, for `from jax.lax import psum as p`
        self.collective_alias: dict[str, str] = {}
        #: the names each scope binds (by assignment or as a parameter), and those it binds to
        #: `None` somewhere, by the path of function names to the scope (`maybe_none`)
        self._bound: dict[tuple[str, ...], set[str]] = {}
        self._none: dict[tuple[str, ...], set[str]] = {}
        self._path: list[str] = []
        self._depth = 0

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        mod = module_name(node.module)
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = dotted(alias.name)
            if mod in SHARD_MAP_MODULES and name == "shard_map":
                self.shard_map_names.add(alias_name(alias) or "shard_map")
            elif mod == "jax" and name == "numpy":
                self.numpy_names.add(alias_name(alias) or "numpy")
            elif mod == "jax" and name == "nn":
                self.nn_names.add(alias_name(alias) or "nn")
            elif mod in ("jax", "spmdtyped") and name == "lax":
                self.lax_names.add(alias_name(alias) or "lax")
            elif mod in ("jax.lax", "spmdtyped.lax") and name in CHECKED:
                self.collective_names.add(alias_name(alias) or name)
                self.collective_alias[alias_name(alias) or name] = name

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted(alias.name)
            if name == "spmdtyped":
                self.st_alias = alias_name(alias) or "spmdtyped"
            elif name == "jax.numpy":
                self.numpy_names.add(alias_name(alias) or "jax.numpy")
            elif name == "jax.nn":
                self.nn_names.add(alias_name(alias) or "jax.nn")
            elif name in ("jax.lax", "spmdtyped.lax"):
                self.lax_names.add(alias_name(alias) or name)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for dec in node.decorators:
            specs = self._specs_of(dec.decorator, decorator=True)
            if specs is not None:
                self.decorated[id(node)] = specs
        self._depth += 1
        self._path.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._depth -= 1
        self._path.pop()

    def _bind(self, name: str, value: cst.BaseExpression | None) -> None:
        scope = tuple(self._path)
        self._bound.setdefault(scope, set()).add(name)
        if isinstance(value, cst.Name) and value.value == "None":
            self._none.setdefault(scope, set()).add(name)

    def maybe_none(self, path: tuple[str, ...], name: str) -> bool:
        """Whether `name`, read in the function at `path` (function names, outermost first),
        may hold None: the innermost scope that binds it (the function, an enclosing one,
        the module: Python's resolution) binds it to None somewhere, by an assignment or a
        parameter's default. (An `out_specs=` of one may be JAX's empty output: `codemod`
        ports that call to typed_shard_map.)"""
        for end in range(len(path), -1, -1):
            if name in self._bound.get(path[:end], ()):
                return name in self._none.get(path[:end], ())
        return False

    def visit_Assign(self, node: cst.Assign) -> None:
        if self._depth == 0 and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            self.consts[node.targets[0].target.value] = node.value
        for t in node.targets:
            if isinstance(t.target, cst.Name):
                self._bind(t.target.value, node.value)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name.value, node.default)   # `def build(mesh, out=None)`

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if isinstance(node.target, cst.Name):
            self._bind(node.target.value, node.value)

    def visit_Call(self, node: cst.Call) -> None:
        specs = self._specs_of(node, decorator=False)
        if specs is not None and node.args and node.args[0].keyword is None \
                and isinstance(node.args[0].value, cst.Name):
            self.targets[node.args[0].value.value] = specs

    def _is_shard_map(self, node: cst.BaseExpression) -> bool:
        return dotted(node) in self.shard_map_names

    def _specs_of(self, node: cst.BaseExpression, decorator: bool) -> Any:
        if not isinstance(node, cst.Call):
            return None
        kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if "axis_names" in kw:
            return None
        if self._is_shard_map(node.func):
            pass
        elif (dotted(node.func) or "").split(".")[-1] == "partial" and node.args \
                and self._is_shard_map(node.args[0].value):
            if not decorator:
                return None
        else:
            return None
        if decorator and self._is_shard_map(node.func) and node.args \
                and node.args[0].keyword is None:
            return None  # shard_map(f, ...) used as a decorator: not a decorator form
        if "in_specs" in kw and "out_specs" in kw:
            return kw["in_specs"], kw["out_specs"]
        return None


def alias_name(alias: cst.ImportAlias) -> str | None:
    if alias.asname is None:
        return None
    name = alias.asname.name
    return name.value if isinstance(name, cst.Name) else None


def is_header(stmt: cst.CSTNode) -> bool:
    """An import or docstring line (new imports go after the module's header)."""
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return all(isinstance(s, (cst.Import, cst.ImportFrom)) or
               (isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString))
               for s in stmt.body)


HINT_NAMES = ("Varying", "Invariant", "Unreduced", "Reduced", "Typed")


def hint_names(text: str) -> set[str]:
    """The hint families a rendered hint uses (for the import line)."""
    return {n for n in HINT_NAMES if re.search(rf"\b{n}\b", text)}


class FunctionLines(cst.CSTVisitor):
    """id(FunctionDef) -> (line of its first decorator or `def`, line of its `def`)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.lines: dict[int, tuple[str, int, int]] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        name = self.get_metadata(PositionProvider, node.name).start.line
        start = self.get_metadata(PositionProvider, node.decorators[0].decorator).start.line \
            if node.decorators else name
        self.lines[id(node)] = (node.name.value, start, name)


# ------------------------------------------------------------------- calls pass 2 rewrites

#: `jax.lax` loops -> (position of the body, positions of the carried values, whether a typed
#: body makes it spmdtyped's). A typed `scan` body stays under `jax.lax.scan`, whose generic
#: signature types the carry from the body's annotations (the plugin's `st.scan` result is
#: `Any` for tuple carries)
LOOPS = {"scan": (0, (1, 2), False), "fori_loop": (2, (3,), True),
         "while_loop": (1, (2,), True)}


def collective_of(info: Collect, call: cst.Call) -> str | None:
    """The collective a call binds (`jax.lax.psum`, `lax.psum`, `from jax.lax import psum`)."""
    name = dotted(call.func) or ""
    head, _, last = name.rpartition(".")
    if head in info.lax_names and last in _surface.LAX_NAMES:
        return last
    return info.collective_alias.get(name)


def lax_function(info: Collect, call: cst.Call) -> str | None:
    """`scan` for `jax.lax.scan(...)` / `lax.scan(...)`: the jax.lax function a call binds."""
    name = dotted(call.func) or ""
    head, _, last = name.rpartition(".")
    return last if head in info.lax_names else None


def number_operand(call: cst.Call) -> bool:
    """A collective whose operand looks like a Python number (`1`, `x.shape[-1]`, ...): it
    stays the drop-in's (the axis-size idiom `lax.psum(1, axis)`)."""
    first = call.args[0].value if call.args else None
    return isinstance(first, (cst.Integer, cst.Float)) or \
        (first is not None and ".shape" in code_of(first))


def size_idiom(info: Collect, call: cst.Call) -> str | None:
    """`"int"` / `"float"` for the axis-size idiom itself, `psum(1, axis)` /
    `psum(x.shape[-1], axis)` (a Python number), else None."""
    if collective_of(info, call) != "psum" or not call.args:
        return None
    first = call.args[0].value
    if isinstance(first, cst.Integer) or (
            isinstance(first, cst.Subscript) and isinstance(first.value, cst.Attribute)
            and first.value.attr.value == "shape"):
        return "int"
    return "float" if isinstance(first, cst.Float) else None


class Defs(cst.CSTVisitor):
    def __init__(self) -> None:
        self.ids: set[int] = set()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.ids.add(id(node))


class Outside(cst.CSTVisitor):
    """The names global code calls: module-level code, and (transitively) the module-level
    functions it calls that no trace saw running inside shard_map (not in `typed`)."""

    def __init__(self, typed: Any) -> None:
        self._typed = typed
        self._top: list[cst.FunctionDef] = []
        self._calls: dict[str | None, set[str]] = {}
        self._defs: dict[str, int] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if not self._top:
            self._defs[node.name.value] = id(node)
        self._top.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._top.pop()

    def visit_Call(self, node: cst.Call) -> None:
        if isinstance(node.func, cst.Name):
            owner = self._top[0].name.value if self._top else None
            self._calls.setdefault(owner, set()).add(node.func.value)

    @property
    def names(self) -> set[str]:
        found: set[str] = set()
        todo: list[str | None] = [None]
        while todo:
            for name in self._calls.get(todo.pop(), set()) - found:
                found.add(name)
                if name in self._defs and self._defs[name] not in self._typed:
                    todo.append(name)
        return found

class PytreeParams(cst.CSTVisitor):
    """Names used as pytrees in a body: subscripted with a string (`params["w"]`), unpacked
    (`w, b = params`), or given to `jax.tree_util` / `jax.tree` functions."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Subscript(self, node: cst.Subscript) -> None:
        if isinstance(node.value, cst.Name) and len(node.slice) == 1 and \
                isinstance(node.slice[0].slice, cst.Index) and \
                isinstance(node.slice[0].slice.value, cst.SimpleString):
            self.names.add(node.value.value)

    def visit_Assign(self, node: cst.Assign) -> None:
        if isinstance(node.value, cst.Name) and any(
                isinstance(t.target, (cst.Tuple, cst.List)) for t in node.targets):
            self.names.add(node.value.value)

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func) or ""
        if name.startswith(("jax.tree_util.", "jax.tree.", "tree_util.")):
            self.names |= {a.value.value for a in node.args if isinstance(a.value, cst.Name)}


def shard_map_decorated(node: cst.FunctionDef, info: Collect) -> bool:
    """Whether a decorator of `node` is a shard_map form (its name is then the shard_map'd
    function, which global code calls)."""
    for dec in node.decorators:
        d = dec.decorator
        if dotted(d) in info.shard_map_names:
            return True
        if isinstance(d, cst.Call):
            if dotted(d.func) in info.shard_map_names:
                return True
            if (dotted(d.func) or "").split(".")[-1] == "partial" and d.args \
                    and dotted(d.args[0].value) in info.shard_map_names:
                return True
    return False
