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
  the surface table (`_surface.NUMPY` / `_surface.NN`) (the same jnp functions, bound on the raw
  values, so the program is unchanged; the results carry spmdtyped's types, which the
  annotations need under mypy), when the result provably stays in code that takes typed
  values (operators, methods, `st.*`, checked collectives, `return`, locals used only so:
  `_Stays`); a result that reaches raw JAX (`lax.scan`'s carry, a `jnp` function outside the
  tables, a helper) keeps the raw call. Other calls, and calls outside those functions, are
  kept.

Checked mode (`port_source(source, states, declared)`, `port FILE --entry f --mesh ...
--in-specs ... --out-specs ... --shapes ...`): the states every function of the file sees are
observed while JAX traces the entry points (`_observe.observe_all`); each observed function is
annotated with them (`_rules.hint_text`; pytrees as `tuple[...]`, `dict[str, ...]`, a
NamedTuple class; what cannot be written is left out and listed as `unannotated: f.p`), the
entry's result with what its out_specs declare, and its body becomes typed code:
`jax.lax` collectives -> `st.<collective>` (`_surface.LAX_NAMES`), surface-table `jnp` /
`jax.nn` functions -> `st.numpy` / `st.nn`, `jax.grad` / `value_and_grad` / `vjp` ->
spmdtyped's; `jax.shard_map` -> `st.shard_map` (`typed_shard_map` where `check_vma=` is not
literally True, or where `out_specs=None`, or a name bound to None where it is read (an
assignment or a parameter's default): JAX's empty output, which st.shard_map reads as
"derive the specs from the hints"). The output traces to
the raw jaxpr, and mypy with the plugin checks it
(`tests/test_porting_codemod.py`).

Prints a unified diff by default; `--write` rewrites the files. Exit status 0, or 1 with
`--check` when a file would change; 2 for bad usage.
"""

from __future__ import annotations

from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper

from spmdtyped import _surface  # plain data; imports no JAX

from .scan import (
    CHECKED,
    LOOPS,
    SHARD_MAP_MODULES,
    Collect,
    Defs,
    FunctionLines,
    Outside,
    PytreeParams,
    alias_name,
    code_of,
    collective_of,
    dotted,
    hint_names,
    is_header,
    lax_function,
    module_name,
    number_operand,
    shard_map_decorated,
    size_idiom,
    spec_hint,
)

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

    def __init__(self, info: Collect, parents: dict[int, cst.CSTNode], st: str) -> None:
        self.info, self.parent, self.st = info, parents, st
        self._names: dict[tuple[int, str], bool] = {}

    def candidate(self, call: cst.Call) -> str | None:
        """`"numpy"` / `"nn"` for a `jnp` / `jax.nn` call st.numpy / st.nn provide, else None."""
        if not isinstance(call.func, cst.Attribute):
            return None
        base, name = dotted(call.func.value), call.func.attr.value
        if base in self.info.numpy_names and _surface.by_function("numpy", name) is not None:
            return "numpy"
        if base in self.info.nn_names and _surface.by_function("nn", name) is not None:
            return "nn"
        return None

    def _typed_callee(self, call: cst.Call) -> bool:
        name = dotted(call.func) or ""
        head, _, last = name.rpartition(".")
        return (self.candidate(call) is not None or name.startswith(f"{self.st}.")
                or name in self.info.collective_names
                or (head in self.info.lax_names and last in CHECKED))

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
    def __init__(self, info: Collect, parents: dict[int, cst.CSTNode],
                 typed: dict[int, tuple[dict[str, str], str | None]] | None = None) -> None:
        self.info = info
        #: checked mode (`port_source(..., states=...)`): id(FunctionDef) -> (parameter
        #: annotations, return annotation) for every function whose states were observed
        self.typed = typed
        #: the names of the typed functions (checked mode): a loop over one is spmdtyped's
        self.typed_names: set[str] = set()
        #: parameters left unannotated in checked mode (no expressible state), as `f.p`
        self.unannotated: list[str] = []
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
        #: the names of the functions around the node visited (`Collect.maybe_none`)
        self._path: list[str] = []

    def _size_annotation(self, original: cst.SimpleStatementLine,
                         updated: cst.SimpleStatementLine) -> Any:
        """`n = lax.psum(x.shape[-1], "tp")` in a ported function -> `n: int = ...`: the
        axis-size idiom is a Python number, which mypy then sees (not `Any`), so what is
        divided by it stays typed."""
        stmt, new = original.body[0], updated.body[0]
        if not (isinstance(stmt, cst.Assign) and isinstance(new, cst.Assign)
                and len(stmt.targets) == 1 and isinstance(stmt.targets[0].target, cst.Name)
                and isinstance(stmt.value, cst.Call)
                and collective_of(self.info, stmt.value) is not None):
            return None
        kind = size_idiom(self.info, stmt.value)
        if kind is None:
            return None
        self.changes.append(f"{stmt.targets[0].target.value}: {kind} (axis-size idiom)")
        return updated.with_changes(body=[cst.AnnAssign(
            target=new.targets[0].target, annotation=cst.Annotation(cst.Name(kind)),
            value=new.value)])

    # imports
    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine,
                                  updated: cst.SimpleStatementLine) -> Any:
        if len(updated.body) == 1 and self._scopes and self._scopes[-1] is not None:
            annotated = self._size_annotation(original, updated)
            if annotated is not None:
                return annotated
        if len(updated.body) != 1 or not isinstance(updated.body[0], cst.ImportFrom):
            return updated
        node = updated.body[0]
        mod = module_name(node.module)
        if isinstance(node.names, cst.ImportStar):
            return updated
        if mod == "jax.lax":
            self.changes.append("from jax.lax import -> from spmdtyped.lax import")
            return updated.with_changes(
                body=[node.with_changes(module=cst.parse_expression("spmdtyped.lax"))])
        if mod not in SHARD_MAP_MODULES:
            return updated
        keep, extra = [], []
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else None
            asname = alias_name(alias)
            if mod == "jax" and name == "lax":
                extra.append(f"from spmdtyped import lax{' as ' + asname if asname else ''}")
                self.changes.append("from jax import lax -> from spmdtyped import lax")
            elif name == "shard_map" and self.typed is not None:
                extra.append(f"from spmdtyped import shard_map"
                             f"{' as ' + asname if asname else ''}")
                self.changes.append("shard_map -> spmdtyped.shard_map")
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
            if dotted(alias.name) == "jax.lax" and alias.asname is not None:
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
        name = dotted(original)
        if name is None:
            return updated
        if name.startswith("jax.lax.") and name[len("jax.lax."):] in CHECKED:
            self.need_st = True
            self.changes.append(f"{name} -> {self.st}.lax.{original.attr.value}")
            return cst.parse_expression(f"{self.st}.lax.{original.attr.value}")
        if name in ("jax.shard_map", "jax.experimental.shard_map.shard_map"):
            self.need_st = True
            target = "shard_map" if self.typed is not None else "adapters.typed_shard_map"
            self.changes.append(f"{name} -> {self.st}.{target}")
            return cst.parse_expression(f"{self.st}.{target}")
        return updated

    # jnp.NAME(...) / jax.nn.NAME(...) -> st.numpy.NAME(...) / st.nn.NAME(...) in ported functions
    def _specs(self, node: cst.FunctionDef) -> Any:
        return self.info.decorated.get(id(node)) or self.info.targets.get(node.name.value)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._path.append(node.name.value)
        if self.typed is not None:
            self._scopes.append(node if id(node) in self.typed else None)
        else:
            self._scopes.append(node if self._specs(node) is not None else None)

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self._scopes.append(None)

    def leave_Lambda(self, original: cst.Lambda, updated: cst.Lambda) -> Any:
        self._scopes.pop()
        return updated

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> Any:
        fn = self._scopes[-1] if self._scopes else None
        if self.typed is not None:
            vma_off = any(a.keyword is not None and a.keyword.value == "check_vma"
                          and code_of(a.value) != "True" for a in original.args)
            # `out_specs=None` is JAX's empty output (a body that returns None); to st.shard_map
            # None means "derive the specs from the hints" (so does a name that may hold None)
            no_out = any(a.keyword is not None and a.keyword.value == "out_specs"
                         and (code_of(a.value) == "None" or isinstance(a.value, cst.Name)
                              and self.info.maybe_none(tuple(self._path), a.value.value))
                         for a in original.args)
            why = "check_vma not literally True" if vma_off else "out_specs may be None"
            adapter = cst.parse_expression(f"{self.st}.adapters.typed_shard_map")
            self.need_st = self.need_st or vma_off or no_out
            if (vma_off or no_out) and dotted(original.func) in self.info.shard_map_names:
                # code run with check_vma=False (st.shard_map's typed values refuse raw JAX
                # there: the states are lost) or returning nothing: typed_shard_map keeps the
                # body's values raw and JAX's out_specs
                self.changes.append(f"{dotted(original.func)} -> {self.st}.adapters."
                                    f"typed_shard_map ({why})")
                return updated.with_changes(func=adapter)
            if (vma_off or no_out) and (dotted(original.func) or "").split(".")[-1] == "partial" \
                    and original.args and dotted(original.args[0].value) in \
                    self.info.shard_map_names:
                self.changes.append(f"partial({dotted(original.args[0].value)}) -> partial("
                                    f"{self.st}.adapters.typed_shard_map) ({why})")
                first = updated.args[0].with_changes(value=adapter)
                return updated.with_changes(args=[first, *updated.args[1:]])
            return updated if fn is None else self._typed_call(original, updated)
        real = collective_of(self.info, original)
        if fn is not None and real is not None and not number_operand(original) \
                and self._stays.stays(original, fn):
            # the state is known (the function is annotated) and the result stays in code that
            # takes typed values: the typed collective, which mypy types
            self.need_st = True
            self.changes.append(f"{dotted(original.func)} -> {self.st}.{real}")
            return updated.with_changes(func=cst.parse_expression(f"{self.st}.{real}"))
        module = self._stays.candidate(original)
        if fn is None or module is None or not self._stays.stays(original, fn):
            return updated
        assert isinstance(original.func, cst.Attribute)
        base, name = dotted(original.func.value), original.func.attr.value
        self.need_st = True
        self.changes.append(f"{base}.{name} -> {self.st}.{module}.{name}")
        return updated.with_changes(func=cst.parse_expression(f"{self.st}.{module}.{name}"))

    def _typed_call(self, original: cst.Call, updated: cst.Call) -> cst.Call:
        """Checked mode, in a typed function: collectives -> `st.<collective>`, `jnp` /
        `jax.nn` functions of the surface table -> `st.numpy` / `st.nn`, `jax.grad` /
        `value_and_grad` / `vjp` -> spmdtyped's (typed cotangents)."""
        name = dotted(original.func) or ""
        head, _, last = name.rpartition(".")
        new: str | None = None
        real = collective_of(self.info, original)
        loop = lax_function(self.info, original)
        if real is not None:
            # `lax.psum(1, axis)` / `lax.psum(x.shape[-1], axis)`: the axis-size idiom on a
            # Python number stays the drop-in's
            if not number_operand(original):
                new = f"{self.st}.{real}"
        elif loop in LOOPS:
            return self._loop(original, updated, loop)
        elif self._stays.candidate(original) is not None:
            new = f"{self.st}.{self._stays.candidate(original)}.{last}"
        elif name in ("jax.grad", "jax.value_and_grad", "jax.vjp"):
            new = f"{self.st}.{last}"
        if new is None:
            return updated
        self.need_st = True
        self.changes.append(f"{name} -> {new}")
        return updated.with_changes(func=cst.parse_expression(new))

    def _loop(self, original: cst.Call, updated: cst.Call, loop: str) -> cst.Call:
        """A `jax.lax` loop in a typed function: spmdtyped's (`st.scan`, ...) when its body is
        one of the file's typed functions (it returns typed values, which a raw loop's carry
        does not take); else the raw loop, given the raw values of its carries."""
        body_at, carried, typed_loop = LOOPS[loop]
        body = original.args[body_at].value if len(original.args) > body_at else None
        if isinstance(body, cst.Name) and body.value in self.typed_names and not typed_loop:
            return updated  # a typed body under jax.lax.scan: its typed carries match
        if isinstance(body, cst.Name) and body.value in self.typed_names:
            self.need_st = True
            self.changes.append(f"{dotted(original.func)} -> {self.st}.{loop}")
            return updated.with_changes(func=cst.parse_expression(f"{self.st}.{loop}"))
        args = list(updated.args)
        for i in carried:
            if i < len(args) and args[i].keyword is None and code_of(args[i].value) != "None":
                self.need_st = True
                call = cst.parse_expression(f"{self.st}.unwrap(x)")
                assert isinstance(call, cst.Call)
                args[i] = args[i].with_changes(value=call.with_changes(
                    args=[cst.Arg(args[i].value)]))
        self.changes.append(f"{dotted(original.func)}: raw carries ({self.st}.unwrap)")
        return updated.with_changes(args=args)

    def _typed_signature(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> Any:
        assert self.typed is not None
        params_hint, ret_hint = self.typed[id(original)]
        new_params = []
        for p in updated.params.params:
            h = params_hint.get(p.name.value)
            if p.annotation is None and h is not None:
                p = p.with_changes(annotation=cst.Annotation(cst.parse_expression(h)))
                self.hints_used |= hint_names(h)
            elif p.annotation is None:
                self.unannotated.append(f"{original.name.value}.{p.name.value}")
            new_params.append(p)
        ret = updated.returns
        if ret is None and ret_hint is not None:
            ret = cst.Annotation(cst.parse_expression(ret_hint))
            self.hints_used |= hint_names(ret_hint)
        self.changes.append(f"annotated {original.name.value}")
        return updated.with_changes(params=updated.params.with_changes(params=new_params),
                                    returns=ret)

    # annotations
    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> Any:
        self._scopes.pop()
        self._path.pop()
        if self.typed is not None:
            return self._typed_signature(original, updated) if id(original) in self.typed \
                else updated
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
        trees = PytreeParams()
        original.body.visit(trees)
        for i, p in enumerate(params):
            h = spec_hint(entries[i], consts, used) if i < len(entries) and len(entries) == len(params) else None
            if h is not None and not h.startswith("tuple[") and p.name.value in trees.names:
                # one spec for a pytree argument (`params["w"]`): a single array's hint would
                # be wrong, and the tree's structure is not written here (checked mode knows it)
                self.unannotated.append(f"{original.name.value}.{p.name.value}")
                h = None
            if p.annotation is None and h is not None:
                p = p.with_changes(annotation=cst.Annotation(cst.parse_expression(h)))
            new_params.append(p)
        ret = updated.returns
        if ret is None:
            h = spec_hint(out_specs, consts, used)
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
        while i < len(body) and is_header(body[i]):
            i += 1
        return updated.with_changes(body=[*body[:i], *imports, *body[i:]])


def _sanitize(hint: str | None) -> str | None:
    from .observe import CONFLICT

    return None if hint in (None, CONFLICT) else hint


def port_source(source: str, states: Any = None,
                declared: dict[str, str | None] | None = None) -> tuple[str, list[str]]:
    """The ported source text and a list of the changes made.

    **Arguments:**

    - `source`: Python source of a module with raw shard_map code.
    - `states`: checked mode. The states each function of the module sees, as
      `_observe.observe` records them (`{(name, first line): Observed}`, merged over the
      traced entry points). Every observed function is annotated with them (parameters that
      hold no array or pytree of arrays, or different states at different calls, are left
      out: the `unannotated: f.p` entries of `changes`), and its body becomes typed code:
      `jax.lax` collectives -> `st.<collective>`, `jnp` / `jax.nn` functions of the surface
      table -> `st.numpy` / `st.nn`, `jax.grad` / `value_and_grad` / `vjp` -> spmdtyped's;
      `jax.shard_map` -> `st.shard_map` (same arguments: the body receives typed values, the
      caller still gets `jax.Array`s). Without `states`: the spec-driven mode (see the module
      docstring).
    - `declared`: checked mode, function name -> the result annotation its `out_specs`
      declare (`observe`'s second result), which wins over the observed result: a wrong
      output is then a mypy error.

    **Returns:** `(new_source, changes)`; `new_source == source` when nothing applies.
    """
    module = cst.parse_module(source)
    info = Collect()
    module.visit(info)
    parents = _Parents()
    module.visit(parents)
    typed = None
    if states is not None:
        lines = FunctionLines()
        MetadataWrapper(module, unsafe_skip_copy=True).visit(lines)
        typed = {}
        for node_id, (name, start, def_line) in lines.lines.items():
            obs = states.get((name, start)) or states.get((name, def_line))
            if obs is None:
                continue
            params = {k: h for k, v in obs.params.items() if (h := _sanitize(v)) is not None}
            ret = (declared or {}).get(name, _sanitize(obs.ret)) \
                if declared and name in declared else _sanitize(obs.ret)
            typed[node_id] = (params, ret)
    kept: list[str] = []
    if typed:
        outside = Outside(typed)
        module.visit(outside)
        for node in module.body:
            if isinstance(node, cst.FunctionDef) and id(node) in typed \
                    and node.name.value in outside.names \
                    and not shard_map_decorated(node, info):
                # also run outside shard_map (global code, a function no trace saw): typed
                # values would reach global code there; the function and its own defs stay raw
                inner = Defs()
                node.visit(inner)
                for d in inner.ids:
                    typed.pop(d, None)
                kept.append(node.name.value)
    port = _Port(info, parents.parent, typed)
    if typed is not None:
        port.typed_names = {lines.lines[i][0] for i in typed}
    new = module.visit(port)
    return new.code, (port.changes + [f"unannotated: {p}" for p in port.unannotated]
                      + [f"kept raw: {k}" for k in kept])

