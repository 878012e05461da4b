"""Array constants: the values a program builds from no traced value (`jnp.ones(4)`, a causal
mask `jnp.tril(jnp.ones((s, s), bool))`, a RoPE table of `np.arange`, a name bound only to
such values). Inside shard_map every one of them is Invariant, as JAX makes it; the checker
sees a plain `jax.Array` (its declared result), which the hooks would read as unknown.

`is_constant` reads the expression (syntax and the callees' full names, never a type it would
have to infer again): a literal, a numpy value, a call of a `jax.numpy` / `numpy` function or
method whose array arguments are all constants, arithmetic and indexing of constants, and a
local or module-level name whose every assignment in its module is a constant. Anything else
(a parameter, a loop variable, `jax.random`, a call of the user's own function) is not.
"""

from __future__ import annotations

from typing import Any, Final

from mypy.nodes import (
    AssignmentStmt,
    Block,
    CallExpr,
    ComparisonExpr,
    ComplexExpr,
    Decorator,
    Expression,
    FloatExpr,
    ForStmt,
    IndexExpr,
    IntExpr,
    ListExpr,
    MemberExpr,
    MypyFile,
    NameExpr,
    OperatorAssignmentStmt,
    OpExpr,
    Statement,
    StrExpr,
    TupleExpr,
    UnaryExpr,
    Var,
    WithStmt,
)
from mypy.types import AnyType, Instance, LiteralType, TupleType, UnionType, get_proper_type

#: the modules whose functions make a constant of constant arguments
_CONSTANT_MODULES: Final = ("numpy.", "jax.numpy.", "jax._src.numpy.")
#: ... except these (a key or a traced size flows in)
_NOT_CONSTANT: Final = ("jax.numpy.fft.", "jax._src.numpy.fft.")
#: `jax.Array` as a checker names it (where JAX defines it)
JAX_ARRAY: Final = "jax._src.basearray.Array"
#: how deep names and calls are followed (a constant built in a few steps)
_DEPTH: Final = 8


def is_numpy(t: Any) -> bool:
    """A numpy array or scalar type: never a traced value (Invariant inside shard_map)."""
    p = get_proper_type(t)
    return isinstance(p, Instance) and p.type.fullname.startswith("numpy.") \
        and p.type.fullname not in ("numpy.dtype",)


def is_constant(api: Any, expr: Expression) -> bool:
    """Whether `expr` builds its value from constants only (see the module docstring)."""
    return _constant(api, expr, _DEPTH, set())


def _array_valued(api: Any, expr: Expression) -> bool:
    """Whether an argument may carry array data (not an int, shape, dtype or string): its
    type as the checker already inferred it, an array or unknown when it has none."""
    try:
        t = get_proper_type(api.lookup_type(expr))
    except (KeyError, AttributeError):
        return True
    if isinstance(t, UnionType):
        return any(_array_type(i) for i in t.items)
    if isinstance(t, TupleType):
        return any(_array_type(i) for i in t.items)
    return _array_type(t)


def _array_type(t: Any) -> bool:
    p = get_proper_type(t)
    if isinstance(p, AnyType):
        return True
    if isinstance(p, LiteralType):
        return False
    if isinstance(p, Instance):
        name = p.type.fullname
        return name == JAX_ARRAY or name.startswith("spmdtyped.") or (
            name in ("builtins.list", "builtins.tuple") and any(_array_type(a) for a in p.args))
    return False


def _constant(api: Any, e: Expression, depth: int, seen: set[int]) -> bool:
    if depth <= 0:
        return False
    if isinstance(e, (IntExpr, FloatExpr, ComplexExpr, StrExpr)):
        return True
    if isinstance(e, (TupleExpr, ListExpr)):
        return all(_constant(api, i, depth - 1, seen) for i in e.items)
    if isinstance(e, (OpExpr, ComparisonExpr)):
        operands = [e.left, e.right] if isinstance(e, OpExpr) else e.operands
        return all(_argument(api, o, depth - 1, seen) for o in operands)
    if isinstance(e, UnaryExpr):
        return _argument(api, e.expr, depth - 1, seen)
    if isinstance(e, IndexExpr):
        return _constant(api, e.base, depth - 1, seen) and _argument(api, e.index, depth - 1, seen)
    if isinstance(e, CallExpr):
        return _call(api, e, depth, seen)
    if isinstance(e, MemberExpr):
        if e.fullname:  # a module attribute: `np.pi`
            return e.fullname.startswith(_CONSTANT_MODULES)
        return _constant(api, e.expr, depth - 1, seen)  # an attribute of a constant: `m.T`
    if isinstance(e, NameExpr):
        return _name(api, e, depth, seen)
    return False


def _argument(api: Any, e: Expression, depth: int, seen: set[int]) -> bool:
    """An argument of a constant: anything that is not an array, or a constant array."""
    return not _array_valued(api, e) or _constant(api, e, depth, seen)


def _call(api: Any, e: CallExpr, depth: int, seen: set[int]) -> bool:
    callee = e.callee
    name = getattr(callee, "fullname", None) or ""
    if name.startswith(_CONSTANT_MODULES) and not name.startswith(_NOT_CONSTANT):
        pass  # `jnp.ones(...)`, `np.arange(...)`, `jnp.tril(...)`: constant on constants
    elif isinstance(callee, MemberExpr) and not name:  # a method of a constant: `m.astype(...)`
        if not _constant(api, callee.expr, depth - 1, seen):
            return False
    else:
        return False
    return all(_argument(api, a, depth - 1, seen) for a in e.args)


def _name(api: Any, e: NameExpr, depth: int, seen: set[int]) -> bool:
    if e.fullname in ("builtins.True", "builtins.False", "builtins.None"):
        return True
    node = e.node
    if not isinstance(node, Var):
        return False
    if node.type is not None and is_numpy(node.type):
        return True
    if id(node) in seen:  # `m = m * 2`: the other assignments decide
        return True
    values = _assignments(api).get(node)
    if not values:  # a parameter, or bound where no value is visible
        return False
    seen = seen | {id(node)}
    return all(v is not None and _constant(api, v, depth - 1, seen) for v in values)


class _Assignments:
    """Every value a module binds to each name (None: bound by a loop, `with`, unpacking).
    A walk over the statements (mypy's visitors are compiled: no subclass of theirs)."""

    def __init__(self) -> None:
        self.values: dict[Var, list[Expression | None]] = {}

    def _bind(self, target: Expression, value: Expression | None) -> None:
        if isinstance(target, NameExpr) and isinstance(target.node, Var):
            self.values.setdefault(target.node, []).append(value)
        elif isinstance(target, (TupleExpr, ListExpr)):
            for t in target.items:
                self._bind(t, None)

    def statements(self, body: list[Statement]) -> None:
        for o in body:
            if isinstance(o, AssignmentStmt):
                for lv in o.lvalues:
                    self._bind(lv, o.rvalue)
            elif isinstance(o, OperatorAssignmentStmt):
                self._bind(o.lvalue, OpExpr(o.op, o.lvalue, o.rvalue))
            elif isinstance(o, ForStmt):
                self._bind(o.index, None)
            elif isinstance(o, WithStmt):
                for t in o.target:
                    if t is not None:
                        self._bind(t, None)
            elif isinstance(o, Decorator):
                o = o.func
            for name in ("body", "else_body", "finally_body", "handlers", "defs"):
                for block in _blocks(getattr(o, name, None)):
                    self.statements(block.body)


def _blocks(x: object) -> list[Block]:
    if isinstance(x, Block):
        return [x]
    if isinstance(x, list):
        return [b for b in x if isinstance(b, Block)]
    return []


#: the module being checked -> its assignments (one module at a time; rebuilt for another)
_INDEX: dict[str, tuple[MypyFile, dict[Var, list[Expression | None]]]] = {}


def _assignments(api: Any) -> dict[Var, list[Expression | None]]:
    tree = getattr(api, "tree", None)
    if not isinstance(tree, MypyFile):
        return {}
    held = _INDEX.get("current")
    if held is not None and held[0] is tree:
        return held[1]
    visitor = _Assignments()
    visitor.statements(tree.defs)
    _INDEX["current"] = (tree, visitor.values)
    return visitor.values
