"""The mesh axis names a module declares: every `jax.make_mesh(shape, ("dp", "tp"))` /
`jax.sharding.Mesh(devices, ("dp", "tp"))` call in it (in any statement at any depth: a `run()` function,
a `with jax.set_mesh(jax.make_mesh(...))`, an argument of a call), when each names its axes as string literals.

With them, an axis a hint or a collective names that no mesh of the module has is SPMD501
(`spmd-unknown-axis`, `_rules.check_axes_known`: the closest axis suggested) where it is
written, instead of a later `assignment` / `arg-type` between two states. A module with no
mesh call, or one whose axis names are not literals (a variable, a mesh from another
module), declares nothing: every axis is accepted, as before.
"""

from __future__ import annotations

from typing import Any, Final

from mypy.nodes import (
    CallExpr,
    Expression,
    ListExpr,
    MemberExpr,
    MypyFile,
    NameExpr,
    Node,
    StrExpr,
    TupleExpr,
)

from .. import _rules
from .._errors import SpmdTypeError

#: callee name -> (position, keyword) of its axis names
_MESH_CALLS: Final = {"make_mesh": (1, "axis_names"), "Mesh": (1, "axis_names"),
                      "AbstractMesh": (1, "axis_names")}
#: module tree -> its declared axes (None: not known); the tree is kept to check identity
_SEEN: dict[int, tuple[MypyFile, frozenset[str] | None]] = {}


def _names(expr: Expression | None) -> frozenset[str] | None:
    if isinstance(expr, TupleExpr | ListExpr) and all(isinstance(i, StrExpr) for i in expr.items):
        return frozenset(i.value for i in expr.items if isinstance(i, StrExpr))
    if isinstance(expr, StrExpr):
        return frozenset((expr.value,))
    return None


def _callee_name(call: CallExpr) -> str | None:
    c = call.callee
    return c.name if isinstance(c, NameExpr | MemberExpr) else None


class _Collect:
    """Walks a module's statements, and the calls in their expressions, for mesh calls (no mypy
    visitor: the plugin reads only the attributes it needs, in every node that has them)."""

    #: where statements hold statements and expressions (blocks, bodies, handlers, decorators)
    _STATEMENT: Final = ("defs", "body", "else_body", "finally_body", "handlers", "func", "expr",
                         "rvalue", "decorators")
    #: where an expression holds the calls followed (`jax.set_mesh(jax.make_mesh(...))`)
    _CALL: Final = ("args", "callee")

    def __init__(self) -> None:
        self.axes: set[str] = set()
        self.found = False
        self.opaque = False

    def visit(self, node: Any, depth: int = 0) -> None:
        if node is None or depth > 200:
            return
        if isinstance(node, list | tuple):
            for n in node:
                self.visit(n, depth + 1)
            return
        if isinstance(node, CallExpr):
            name = _callee_name(node)
            if name in _MESH_CALLS:
                self._mesh(node, *_MESH_CALLS[name])
            children: tuple[str, ...] = self._CALL
        elif isinstance(node, Expression):
            if not isinstance(node, MemberExpr):
                return  # an operator, a literal, a name: no mesh call followed inside
            children = ("expr",)  # `jax.make_mesh(...).shape`
        elif isinstance(node, Node):
            children = self._STATEMENT
        else:
            return
        for attr in children:
            child = getattr(node, attr, None)
            if child is not None and child is not node:
                self.visit(child, depth + 1)

    def _mesh(self, call: CallExpr, pos: int, keyword: str) -> None:
        expr: Expression | None = None
        positional = [a for a, k in zip(call.args, call.arg_kinds, strict=True) if k.is_positional()]
        for a, n in zip(call.args, call.arg_names, strict=True):
            if n == keyword:
                expr = a
        if expr is None and len(positional) > pos:
            expr = positional[pos]
        names = _names(expr)
        self.found = True
        if names is None:
            self.opaque = True
        else:
            self.axes |= names


def module_axes(tree: MypyFile | None) -> frozenset[str] | None:
    """The axis names of the module's meshes (None: no mesh call, or one not literal)."""
    if tree is None:
        return None
    seen = _SEEN.get(id(tree))
    if seen is not None and seen[0] is tree:
        return seen[1]
    walk = _Collect()
    walk.visit(tree.defs)
    axes = frozenset(walk.axes) if walk.found and not walk.opaque else None
    if len(_SEEN) > 64:  # keep the trees of the modules being checked, not of every module
        _SEEN.clear()
    _SEEN[id(tree)] = (tree, axes)
    return axes


def checker_tree(api: Any) -> MypyFile | None:
    """The module a checker or a semantic analyser (a type-analyze hook's `api.api`) is on."""
    tree = getattr(api, "tree", None)
    if isinstance(tree, MypyFile):
        return tree
    inner = getattr(api, "api", None)
    tree = getattr(inner, "cur_mod_node", None)
    return tree if isinstance(tree, MypyFile) else None


def unknown_axis(api: Any, axes: tuple[str, ...] | list[str] | frozenset[str], op: str
                 ) -> SpmdTypeError | None:
    """SPMD501 for an axis no mesh of the module has (None: all known, or no literal mesh)."""
    known = module_axes(checker_tree(api))
    if known is None or not axes:
        return None
    try:
        _rules.check_axes_known(sorted(axes), op, manual=sorted(known))
    except SpmdTypeError as err:
        return err
    return None
