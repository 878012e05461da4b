"""`python -m spmdtyped port FILE...`: rewrite raw shard_map code to spmdtyped (libcst).

What it rewrites, keeping everything else byte for byte (comments, formatting):

- imports: `from jax import lax` -> `from spmdtyped import lax`; `import jax.lax as L` ->
  `import spmdtyped.lax as L`; `from jax.lax import psum` -> `from spmdtyped.lax import psum`;
  `from jax import shard_map` (or `jax.experimental.shard_map`) ->
  `from spmdtyped.adapters import typed_shard_map as shard_map`;
- attribute calls: `jax.lax.psum(...)` (any checked collective) -> `st.lax.psum(...)`,
  `jax.shard_map` -> `st.adapters.typed_shard_map` (adding `import spmdtyped as st`);
- annotations: for a function passed to shard_map (call, `partial(shard_map, ...)` decorator
  or `@jax.shard_map(...)` decorator) whose `in_specs`/`out_specs` are literal
  `P(...)` expressions (or module-level names bound to them), unannotated parameters and
  the return get the states the specs determine: `P("dp")` -> `Varying["dp"]`, `P()` ->
  `Invariant`, `P(reduced={"tp"})` -> `Reduced["tp"]`, a tuple -> `tuple[...]`. The names
  are imported from spmdtyped. (An Invariant output under a partitioned out_spec is
  annotated Varying, which it is a subtype of.) Partial-manual calls (`axis_names=`) are
  rewritten but not annotated. For exact states of every value use `python -m spmdtyped infer`;
- typed numpy/nn calls: in those functions' own bodies (not in nested defs or lambdas, which
  are typically handed to JAX transforms that need raw results), `jnp.NAME(...)` /
  `jax.numpy.NAME(...)` -> `st.numpy.NAME(...)` and `jax.nn.NAME(...)` -> `st.nn.NAME(...)`
  for the names in
  `_rules.NUMPY_FUNCTIONS` / `_rules.NN_FUNCTIONS` (the same jnp functions, bound on the raw
  values, so the program is unchanged; the results carry spmdtyped's types, which the
  annotations need under mypy), when the result provably stays in code that takes typed
  values (operators, methods, `st.*`, checked collectives, `return`, locals used only so:
  `_Stays`); a result that reaches raw JAX (`lax.scan`'s carry, a `jnp` function outside the
  tables, a helper) keeps the raw call. Other calls, and calls outside those functions, are
  kept.

Prints a unified diff by default; `--write` rewrites the files. Exit status 0, or 1 with
`--check` when a file would change.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import sys
from collections.abc import Sequence
from typing import Any

import libcst as cst

from spmdtyped import _rules, _surface  # plain data; imports no JAX

#: the collectives `spmdtyped.lax` checks: the surface table's (`_surface.LAX_NAMES`, plain data:
#: porting imports no JAX)
_CHECKED = _surface.LAX_NAMES

_SHARD_MAP_MODULES = ("jax", "jax.experimental.shard_map")
_SPEC_NAMES = ("P", "PartitionSpec")


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr.value}"
    return None


def _module_name(node: cst.BaseExpression | None) -> str | None:
    return None if node is None else _dotted(node)


def _code(node: cst.CSTNode) -> str:
    return cst.Module(body=[]).code_for_node(node)


# ------------------------------------------------------------------- specs -> hints


def _spec_hint(node: cst.BaseExpression, consts: dict[str, cst.BaseExpression],
               used: set[str], depth: int = 0) -> str | None:
    """The hint a literal in_spec/out_spec determines, or None when it is not literal."""
    if isinstance(node, cst.Name) and node.value in consts and depth < 4:
        return _spec_hint(consts[node.value], consts, used, depth + 1)
    if isinstance(node, cst.Name) and node.value == "None":
        used.add("Invariant")
        return "Invariant"
    if isinstance(node, (cst.Tuple, cst.List)):
        parts = [_spec_hint(e.value, consts, used, depth) for e in node.elements]
        known = [p for p in parts if p is not None]
        if len(known) != len(parts):
            return None
        return f"tuple[{', '.join(known)}]"
    if not isinstance(node, cst.Call):
        return None
    fname = _dotted(node.func) or ""
    if fname.split(".")[-1] not in _SPEC_NAMES:
        return None
    varying: list[str] = []
    sets: dict[str, list[str]] = {"unreduced": [], "reduced": []}
    try:
        for arg in node.args:
            value = ast.literal_eval(_code(arg.value))
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
    hints: list[str] = []
    for label, axes in (("Varying", varying), ("Unreduced", sets["unreduced"]),
                        ("Reduced", sets["reduced"])):
        if axes:
            used.add(label)
            hints.append(f"{label}[{', '.join(repr(a).replace(chr(39), chr(34)) for a in axes)}]")
    if not hints:
        used.add("Invariant")
        return "Invariant"
    if len(hints) > 1:
        used.add("Typed")
        return f"Typed[{', '.join(hints)}]"
    return hints[0]


# ------------------------------------------------------------------- pass 1: find shard_maps


class _Collect(cst.CSTVisitor):
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
        self._depth = 0

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        mod = _module_name(node.module)
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = _dotted(alias.name)
            if mod in _SHARD_MAP_MODULES and name == "shard_map":
                self.shard_map_names.add(_asname(alias) or "shard_map")
            elif mod == "jax" and name == "numpy":
                self.numpy_names.add(_asname(alias) or "numpy")
            elif mod == "jax" and name == "nn":
                self.nn_names.add(_asname(alias) or "nn")
            elif mod in ("jax", "spmdtyped") and name == "lax":
                self.lax_names.add(_asname(alias) or "lax")
            elif mod in ("jax.lax", "spmdtyped.lax") and name in _CHECKED:
                self.collective_names.add(_asname(alias) or name)

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = _dotted(alias.name)
            if name == "spmdtyped":
                self.st_alias = _asname(alias) or "spmdtyped"
            elif name == "jax.numpy":
                self.numpy_names.add(_asname(alias) or "jax.numpy")
            elif name == "jax.nn":
                self.nn_names.add(_asname(alias) or "jax.nn")
            elif name in ("jax.lax", "spmdtyped.lax"):
                self.lax_names.add(_asname(alias) or name)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        for dec in node.decorators:
            specs = self._specs_of(dec.decorator, decorator=True)
            if specs is not None:
                self.decorated[id(node)] = specs
        self._depth += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._depth -= 1

    def visit_Assign(self, node: cst.Assign) -> None:
        if self._depth == 0 and len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name):
            self.consts[node.targets[0].target.value] = node.value

    def visit_Call(self, node: cst.Call) -> None:
        specs = self._specs_of(node, decorator=False)
        if specs is not None and node.args and node.args[0].keyword is None \
                and isinstance(node.args[0].value, cst.Name):
            self.targets[node.args[0].value.value] = specs

    def _is_shard_map(self, node: cst.BaseExpression) -> bool:
        return _dotted(node) in self.shard_map_names

    def _specs_of(self, node: cst.BaseExpression, decorator: bool) -> Any:
        if not isinstance(node, cst.Call):
            return None
        kw = {a.keyword.value: a.value for a in node.args if a.keyword is not None}
        if "axis_names" in kw:
            return None
        if self._is_shard_map(node.func):
            pass
        elif (_dotted(node.func) or "").split(".")[-1] == "partial" and node.args \
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


def _asname(alias: cst.ImportAlias) -> str | None:
    if alias.asname is None:
        return None
    name = alias.asname.name
    return name.value if isinstance(name, cst.Name) else None


# ------------------------------------------------------------------- typed results: where they go


class _Parents(cst.CSTVisitor):
    """Every node's parent, by identity."""

    def __init__(self) -> None:
        self.parent: dict[int, cst.CSTNode] = {}
        self._stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parent[id(node)] = self._stack[-1]
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()


class _Stays:
    """Whether a value stays in code that takes spmdtyped's typed values.

    `st.numpy` / `st.nn` return typed values; raw JAX code (a `jnp` function outside the
    tables, `lax.scan`'s carry, `jax.grad`, a helper) does not take them. A call is rewritten
    only when its result provably reaches nothing but operators, indexing and methods of the
    value, `st.*` calls, checked collectives, other rewritten calls, tuples and the `return`
    of the ported function itself, or a local name all of whose uses do (conservative:
    anything else keeps the raw call)."""

    def __init__(self, info: _Collect, parents: dict[int, cst.CSTNode], st: str) -> None:
        self.info, self.parent, self.st = info, parents, st
        self._names: dict[tuple[int, str], bool] = {}

    def candidate(self, call: cst.Call) -> str | None:
        """`"numpy"` / `"nn"` for a `jnp` / `jax.nn` call st.numpy / st.nn provide, else None."""
        if not isinstance(call.func, cst.Attribute):
            return None
        base, name = _dotted(call.func.value), call.func.attr.value
        if base in self.info.numpy_names and name in _rules.NUMPY_FUNCTIONS:
            return "numpy"
        if base in self.info.nn_names and name in _rules.NN_FUNCTIONS:
            return "nn"
        return None

    def _typed_callee(self, call: cst.Call) -> bool:
        name = _dotted(call.func) or ""
        head, _, last = name.rpartition(".")
        return (self.candidate(call) is not None or name.startswith(f"{self.st}.")
                or name in self.info.collective_names
                or (head in self.info.lax_names and last in _CHECKED))

    def _scope(self, node: cst.CSTNode) -> cst.CSTNode | None:
        p = self.parent.get(id(node))
        while p is not None and not isinstance(p, (cst.FunctionDef, cst.Lambda)):
            p = self.parent.get(id(p))
        return p

    def stays(self, node: cst.CSTNode, fn: cst.FunctionDef) -> bool:
        """Whether the value of expression `node` (in `fn`'s own scope) stays typed-safe."""
        if self._scope(node) is not fn:
            return False
        while True:
            p = self.parent.get(id(node))
            if isinstance(p, (cst.BinaryOperation, cst.UnaryOperation, cst.Comparison,
                              cst.ComparisonTarget, cst.Element, cst.Tuple, cst.List)):
                pass
            elif isinstance(p, cst.Subscript) and p.value is node:
                pass
            elif isinstance(p, cst.Attribute) and p.value is node:
                pass  # a method (`.reshape`) or property (`.T`) of the value
            elif isinstance(p, cst.Call) and p.func is not node and not self._typed_callee(p):
                return False
            elif isinstance(p, cst.Call):
                pass  # `x.reshape(...)`, or an argument of a typed-aware callee
            elif isinstance(p, cst.Arg) and p.value is node:
                pass
            elif isinstance(p, cst.Return):
                return True
            elif isinstance(p, (cst.Assign, cst.AnnAssign)) and p.value is node:
                targets = [t.target for t in p.targets] if isinstance(p, cst.Assign) \
                    else [p.target]
                return all(isinstance(t, cst.Name) and self._name_stays(t.value, fn)
                           for t in targets)
            else:
                return False
            node = p

    def _name_stays(self, name: str, fn: cst.FunctionDef) -> bool:
        key = (id(fn), name)
        if key in self._names:
            return self._names[key]
        self._names[key] = True  # assumed while its uses are checked (x = f(x))
        uses = _Uses(name, self.parent)
        fn.body.visit(uses)
        ok = all(self.stays(u, fn) for u in uses.found)
        self._names[key] = ok
        return ok


class _Uses(cst.CSTVisitor):
    """The loads of a name (bindings, attribute names and keywords left out)."""

    def __init__(self, name: str, parents: dict[int, cst.CSTNode]) -> None:
        self.name, self.parent = name, parents
        self.found: list[cst.Name] = []

    def visit_Name(self, node: cst.Name) -> None:
        if node.value != self.name:
            return
        p = self.parent.get(id(node))
        if isinstance(p, cst.AssignTarget) or (isinstance(p, cst.AnnAssign) and p.target is node) \
                or (isinstance(p, cst.Attribute) and p.attr is node) \
                or (isinstance(p, cst.Arg) and p.keyword is node) or isinstance(p, cst.Param):
            return
        self.found.append(node)


# ------------------------------------------------------------------- pass 2: rewrite


class _Port(cst.CSTTransformer):
    def __init__(self, info: _Collect, parents: dict[int, cst.CSTNode]) -> None:
        self.info = info
        self.st = info.st_alias or "st"
        self._stays = _Stays(info, parents, self.st)
        self.need_st = False
        self.hints_used: set[str] = set()
        self.changes: list[str] = []
        #: one entry per enclosing function or lambda: whether it is a ported one. Calls are
        #: rewritten in a ported function's own scope only: a nested def or lambda is typically
        #: handed to a JAX transform (`jax.grad(loss)`, `lax.scan(body, ...)`), which needs raw
        #: results, not spmdtyped's typed values
        self._scopes: list[cst.FunctionDef | None] = []

    # imports
    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                  updated: cst.SimpleStatementLine) -> Any:
        if len(updated.body) != 1 or not isinstance(updated.body[0], cst.ImportFrom):
            return updated
        node = updated.body[0]
        mod = _module_name(node.module)
        if isinstance(node.names, cst.ImportStar):
            return updated
        if mod == "jax.lax":
            self.changes.append("from jax.lax import -> from spmdtyped.lax import")
            return updated.with_changes(
                body=[node.with_changes(module=cst.parse_expression("spmdtyped.lax"))])
        if mod not in _SHARD_MAP_MODULES:
            return updated
        keep, extra = [], []
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else None
            asname = _asname(alias)
            if mod == "jax" and name == "lax":
                extra.append(f"from spmdtyped import lax{' as ' + asname if asname else ''}")
                self.changes.append("from jax import lax -> from spmdtyped import lax")
            elif name == "shard_map":
                extra.append(f"from spmdtyped.adapters import typed_shard_map as "
                             f"{asname or 'shard_map'}")
                self.changes.append("shard_map -> spmdtyped.adapters.typed_shard_map")
            else:
                keep.append(alias)
        if not extra:
            return updated
        lines: list[Any] = []
        if keep:
            keep[-1] = keep[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            lines.append(updated.with_changes(body=[node.with_changes(names=keep)]))
        for i, text in enumerate(extra):
            line = cst.parse_statement(text)
            if i == 0 and not keep:
                line = line.with_changes(leading_lines=updated.leading_lines)
            lines.append(line)
        return cst.FlattenSentinel(lines)

    def leave_Import(self, original: cst.Import, updated: cst.Import) -> Any:
        new = []
        changed = False
        for alias in updated.names:
            if _dotted(alias.name) == "jax.lax" and alias.asname is not None:
                new.append(alias.with_changes(name=cst.parse_expression("spmdtyped.lax")))
                changed = True
            else:
                new.append(alias)
        if changed:
            self.changes.append("import jax.lax as ... -> import spmdtyped.lax as ...")
            return updated.with_changes(names=new)
        return updated

    # jax.lax.<collective>, jax.shard_map
    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> Any:
        name = _dotted(original)
        if name is None:
            return updated
        if name.startswith("jax.lax.") and name[len("jax.lax."):] in _CHECKED:
            self.need_st = True
            self.changes.append(f"{name} -> {self.st}.lax.{original.attr.value}")
            return cst.parse_expression(f"{self.st}.lax.{original.attr.value}")
        if name in ("jax.shard_map", "jax.experimental.shard_map.shard_map"):
            self.need_st = True
            self.changes.append(f"{name} -> {self.st}.adapters.typed_shard_map")
            return cst.parse_expression(f"{self.st}.adapters.typed_shard_map")
        return updated

    # jnp.NAME(...) / jax.nn.NAME(...) -> st.numpy.NAME(...) / st.nn.NAME(...) in ported functions
    def _specs(self, node: cst.FunctionDef) -> Any:
        return self.info.decorated.get(id(node)) or self.info.targets.get(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scopes.append(node if self._specs(node) is not None else None)

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._scopes.append(None)

    def leave_Lambda(self, original: cst.Lambda, updated: cst.Lambda) -> Any:
        self._scopes.pop()
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> Any:
        fn = self._scopes[-1] if self._scopes else None
        module = self._stays.candidate(original)
        if fn is None or module is None or not self._stays.stays(original, fn):
            return updated
        assert isinstance(original.func, cst.Attribute)
        base, name = _dotted(original.func.value), original.func.attr.value
        self.need_st = True
        self.changes.append(f"{base}.{name} -> {self.st}.{module}.{name}")
        return updated.with_changes(func=cst.parse_expression(f"{self.st}.{module}.{name}"))

    # annotations
    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> Any:
        self._scopes.pop()
        specs = self._specs(original)
        if specs is None:
            return updated
        in_specs, out_specs = specs
        consts = self.info.consts
        used: set[str] = set()
        params = list(updated.params.params)
        in_node = in_specs
        if isinstance(in_node, cst.Name) and in_node.value in consts:
            in_node = consts[in_node.value]
        entries = [e.value for e in in_node.elements] if isinstance(in_node, (cst.Tuple, cst.List)) \
            else [in_node] * len(params)
        new_params = []
        for i, p in enumerate(params):
            h = _spec_hint(entries[i], consts, used) if i < len(entries) and len(entries) == len(params) else None
            if p.annotation is None and h is not None:
                p = p.with_changes(annotation=cst.Annotation(cst.parse_expression(h)))
            new_params.append(p)
        ret = updated.returns
        if ret is None:
            h = _spec_hint(out_specs, consts, used)
            if h is not None:
                ret = cst.Annotation(cst.parse_expression(h))
        if new_params == params and ret is updated.returns:
            return updated
        self.hints_used |= used
        self.changes.append(f"annotated {original.name.value}")
        return updated.with_changes(params=updated.params.with_changes(params=new_params),
                                    returns=ret)

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        imports = []
        if self.need_st and self.info.st_alias is None:
            imports.append(cst.parse_statement("import spmdtyped as st"))
        if self.hints_used:
            names = ", ".join(sorted(self.hints_used))
            imports.append(cst.parse_statement(f"from spmdtyped import {names}"))
        if not imports:
            return updated
        body = list(updated.body)
        # after the docstring, __future__ imports and the leading import block
        i = 0
        while i < len(body) and _is_header(body[i]):
            i += 1
        return updated.with_changes(body=[*body[:i], *imports, *body[i:]])


def _is_header(stmt: cst.CSTNode) -> bool:
    if not isinstance(stmt, cst.SimpleStatementLine):
        return False
    return all(isinstance(s, (cst.Import, cst.ImportFrom)) or
               (isinstance(s, cst.Expr) and isinstance(s.value, cst.SimpleString))
               for s in stmt.body)


def port_source(source: str) -> tuple[str, list[str]]:
    """The ported source text and a list of the changes made.

    **Arguments:** `source`: Python source of a module with raw shard_map code.

    **Returns:** `(new_source, changes)`; `new_source == source` when nothing applies.
    """
    module = cst.parse_module(source)
    info = _Collect()
    module.visit(info)
    parents = _Parents()
    module.visit(parents)
    port = _Port(info, parents.parent)
    new = module.visit(port)
    return new.code, port.changes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m spmdtyped port",
        description="Rewrite raw jax.shard_map code to spmdtyped: checked collectives, "
                    "checked shard_map, annotations from the specs.")
    parser.add_argument("files", nargs="+", metavar="FILE")
    parser.add_argument("--write", action="store_true", help="rewrite the files in place")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if any file would change (prints the diff)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    changed = 0
    for path in args.files:
        try:
            with open(path, encoding="utf-8") as fh:
                old = fh.read()
            new, _changes = port_source(old)
        except (OSError, cst.ParserSyntaxError) as e:
            print(f"{path}: error: {e}", file=sys.stderr)
            return 2
        if new == old:
            continue
        changed += 1
        if args.write:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(new)
            print(f"ported {path}")
        else:
            sys.stdout.writelines(difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"a/{path}", tofile=f"b/{path}"))
    if changed == 0:
        print("nothing to port", file=sys.stderr)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
