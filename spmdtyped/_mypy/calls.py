"""Calls of the user's own functions: a helper whose parameters have no state keeps the states.

`def add_bias(h, b): return h + b` has no annotations (or `Any` ones; `jax.Array` ones too,
though a typed argument for one is mypy's `arg-type` already), so mypy types its result `Any`
and checks nothing inside it. Called with typed arguments
(`add_bias(x @ w, b)`: a Partial over 'tp' and an Invariant bias), the helper's body is
checked again with the call's argument types for those parameters, as mypy checks a lambda
against its context (`TypeChecker.check_func_item` with a `type_override`, its types kept in a
throw-away type map): the result is the body's return type, and a rule error inside the body
on those arguments is reported at the call, with the helper's name, the line of the mistake in
its body and the rule's fix. A parameter left to a literal default (`axis="dp"`) has the
literal's type.

Never a false error on a correct program: only what the body does on every path it takes on
these arguments is reported. A literal argument is passed as its literal type, so mypy skips
the branches it rules out (`if reduced:` for `reduced=False`), and an `if` block is reported
only where the `if` is sure to take it (`_taken`: its condition a literal bool, or its other
block left unchecked); the blocks of an `if` no literal decides (a flag the caller sets only
for arguments that suit the block, a shape test), loop bodies (mypy checks one with the
types of its later iterations joined in, which a loop run once never has) and a `try`'s `except` /
`else` blocks are not; a `try`'s body and `finally` are. A result is typed only where every
reachable return has one and the same known type.

Bounded: a body is checked once per (function, argument types) in a run (`_MEMO`), at most
`DEPTH` helpers deep, never into itself (recursion). A call whose arguments carry no state
(plain arrays, `Any`) keeps mypy's own result, as do decorated functions, overloads,
generators, coroutines and constructors (`__init__`: its check infers the class's
attributes). What the re-check changes in the helper's nodes (its parameters'
and locals' inferred types, `FuncItem.expanded`) is put back.

Methods too: `self.mlp(h)` on an equinox or flax nnx module whose `__call__` has no
annotations is checked the same way, `self` typed as the receiver. A helper `jax.tree.map`
maps (`jax.tree.map(average, grads)`, `check_mapped`, from `pytrees`) is checked on the trees'
leaf types. And `jax.vmap(f)(*args)` of a function, bound method or lambda of the module whose
body takes a gradient (`st.grad(loss)(p, x)`, `g(p, x)` of `g = jax.grad(loss)`): its body is
checked on the arguments with `VMAPPED` set, where each gradient call is checked for
per-example gradients of a replicated parameter (SPMD407, `autodiff.grad_call`; of a lambda,
only that: the rest of its body was checked where it stands).

Helpers of the module being checked only: mypy frees a module's function bodies once it is
checked (and one read from its cache has none), so a helper imported from another module keeps
mypy's own result. That also keeps the cache right: a caller's errors depend on no other
module's bodies.
"""

from __future__ import annotations

from typing import Any, Final

from mypy.nodes import (
    ARG_NAMED,
    ARG_NAMED_OPT,
    ARG_OPT,
    ARG_POS,
    FUNC_NO_INFO,
    AssignmentStmt,
    Block,
    Decorator,
    Expression,
    ExpressionStmt,
    ForStmt,
    FuncDef,
    FuncItem,
    IfStmt,
    IntExpr,
    LambdaExpr,
    ListExpr,
    NameExpr,
    ReturnStmt,
    StarExpr,
    Statement,
    StrExpr,
    TryStmt,
    TupleExpr,
    TypeInfo,
    Var,
    WhileStmt,
    WithStmt,
)
from mypy.plugin import FunctionContext, MethodContext
from mypy.traverser import all_name_and_member_expressions
from mypy.types import (
    AnyType,
    CallableType,
    Instance,
    LiteralType,
    TupleType,
    Type,
    UnionType,
    get_proper_type,
)

from .._rules import SpmdType
from .codes import AXIS, CODES, UNKNOWN
from .convert import SARRAY, any_type, named, to_operand

#: a rule error found in a helper's body: severity, message, code, line
_Found = tuple[str, str, Any, int]
#: how many helpers deep a re-check goes (a helper calling a helper calling a helper)
DEPTH: Final = 3
_JAX_ARRAY: Final = frozenset({"jax._src.basearray.Array", "jax.Array"})
#: the codes reported again at the call: the rule table's (not the opt-in ones)
_RULE_CODES: Final = frozenset(c for c in CODES.values() if c not in (AXIS, UNKNOWN))
#: per-example gradients of a replicated parameter (`autodiff.grad_call`)
_VMAP_CODES: Final = frozenset({CODES["SPMD407"]})
_PREFIX: Final = "in `"
_SINGLE: Final = (ARG_POS, ARG_OPT, ARG_NAMED, ARG_NAMED_OPT)
#: methods whose check infers the class's attributes (`self.w = ...`): never checked again
_CONSTRUCTION: Final = frozenset({"__init__", "__new__", "__post_init__", "__init_subclass__"})


def definition(node: Any) -> FuncDef | None:
    """The `FuncDef` of a user function a call can be re-checked through, else None."""
    if isinstance(node, Decorator) or not isinstance(node, FuncDef):
        return None
    if node.is_generator or node.is_coroutine or node.is_property or node.is_overload \
            or node.name in _CONSTRUCTION:
        return None
    t = get_proper_type(node.type) if node.type is not None else None
    if t is None:
        return node
    if not isinstance(t, CallableType):
        return None
    start = 1 if is_method(node) else 0
    return node if any(_open(a) for a in t.arg_types[start:]) else None


def method(info: Any, name: str) -> FuncDef | None:
    """The method `name` of class `info` (inherited ones too), re-checkable, else None."""
    if not isinstance(info, TypeInfo):
        return None
    node = info.get_method(name)
    return definition(node) if node is not None and is_method(node) else None


def is_method(node: Any) -> bool:
    """An instance method (its first parameter is the receiver)."""
    return isinstance(node, FuncDef) and node.info is not FUNC_NO_INFO and not node.is_static \
        and not node.is_class and bool(node.arg_names)


def _open(t: Type) -> bool:
    """A parameter type that says nothing of a state: none, `Any`, `jax.Array`."""
    p = get_proper_type(t)
    return isinstance(p, AnyType) or (isinstance(p, Instance) and p.type.fullname in _JAX_ARRAY)


def _literal(t: Type) -> Type:
    """A literal argument's own type (`False`, `"sum"`): mypy then skips the branches of the
    helper it does not take (`if reduced:`)."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.last_known_value is not None:
        return p.last_known_value
    return t


def _default(api: Any, defn: FuncDef, i: int, formal: Type) -> Type:
    """The type of parameter `i` left to its default: a literal default's own literal type
    where the parameter says nothing of it (`axis="dp"`: a collective over it is checked),
    else `formal`."""
    init = defn.arguments[i].initializer
    if not _open(formal) or init is None:
        return formal
    if isinstance(init, StrExpr | IntExpr):
        base = "builtins.str" if isinstance(init, StrExpr) else "builtins.int"
        return LiteralType(init.value, named(api, base, []))
    if isinstance(init, NameExpr) and init.fullname in ("builtins.True", "builtins.False"):
        return LiteralType(init.fullname == "builtins.True", named(api, "builtins.bool", []))
    return formal


def _imprecise(t: Type) -> bool:
    """`Any`, or a union or tuple with an `Any` among its items (`Any | SArray[...]`)."""
    p = get_proper_type(t)
    return isinstance(p, AnyType) or (isinstance(p, UnionType | TupleType)
                                      and any(_imprecise(i) for i in p.items))


def _stated(t: Type) -> bool:
    """An argument of a known state (a typed array, or a tuple / list of them)."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY:
        return isinstance(to_operand(p), SpmdType)
    items = getattr(p, "items", None)
    if isinstance(items, list):
        return any(_stated(i) for i in items)
    if isinstance(p, Instance) and p.type.fullname in ("builtins.list", "builtins.tuple") and p.args:
        return _stated(p.args[-1])
    return False


def check_call(ctx: FunctionContext, defn: FuncDef) -> Type:
    """A call of a user function (`definition`): its body's result on the call's arguments."""
    return _check(ctx, defn, None)


def check_method_call(ctx: MethodContext, defn: FuncDef) -> Type:
    """A method call on an instance (`method`): the same, `self` typed as the receiver."""
    return _check(ctx, defn, ctx.type)


def _check(ctx: FunctionContext | MethodContext, defn: FuncDef, receiver: Type | None) -> Type:
    default = ctx.default_return_type
    if _DEPTH[0] >= DEPTH or id(defn) in _ACTIVE or not _open(default) \
            or not user_code(ctx.api) or not has_body(ctx.api, defn):
        return default
    declared = get_proper_type(defn.type) if defn.type is not None else None
    if isinstance(declared, CallableType) and declared.variables:
        return default  # a generic helper: mypy's own inference of the call
    start = 1 if receiver is not None else 0
    n = len(defn.arguments)
    if len(ctx.arg_types) != n - start:
        return default
    types: list[Type] = [receiver] if receiver is not None else []
    stated = False
    for i in range(start, n):
        formal = declared.arg_types[i] if isinstance(declared, CallableType) else any_type()
        acts, kinds = ctx.arg_types[i - start], ctx.arg_kinds[i - start]
        if len(acts) == 1 and kinds[0] in _SINGLE and defn.arg_kinds[i] in _SINGLE and _open(formal):
            types.append(_literal(acts[0]))
            stated = stated or _stated(acts[0])
        else:
            types.append(_default(ctx.api, defn, i, formal) if not acts else formal)
    if not stated:
        return default  # plain arrays: mypy's own result, as before
    _report(ctx, defn, types)
    memo = _MEMO.get(_key(defn, types))
    return memo[1] if memo is not None and memo[1] is not None else default


def check_mapped(ctx: FunctionContext, defn: FuncDef, leaves: list[Type]) -> Type | None:
    """`jax.tree.map(helper, tree, *rest)` of a function of the module (`definition`): its
    body checked on the trees' leaf types (`leaves`: one per tree, a union of each tree's
    leaves; `Any` before them for the path of `tree_map_with_path`), its rule errors reported
    at the call; the body's result type for each leaf, else None."""
    if _DEPTH[0] >= DEPTH or id(defn) in _ACTIVE or is_method(defn) or not user_code(ctx.api) \
            or not has_body(ctx.api, defn) or len(leaves) > len(defn.arguments) \
            or not any(_stated(t) for t in leaves):
        return None
    declared = get_proper_type(defn.type) if defn.type is not None else None
    if isinstance(declared, CallableType) and declared.variables:
        return None
    types: list[Type] = []
    for i in range(len(defn.arguments)):
        formal = declared.arg_types[i] if isinstance(declared, CallableType) else any_type()
        mapped = i < len(leaves) and defn.arg_kinds[i] in _SINGLE and _open(formal)
        types.append(leaves[i] if mapped else _default(ctx.api, defn, i, formal))
    _report(ctx, defn, types)
    memo = _MEMO.get(_key(defn, types))
    return memo[1] if memo is not None else None


def check_vmapped(ctx: MethodContext, defn: FuncItem, positional: list[Type]) -> None:
    """`jax.vmap(f)(*args)` of a function, bound method or lambda of the module whose body
    takes a gradient (`autodiff.grad_call`): the body checked on the arguments' types as traced
    under vmap (`positional`: the receiver's first for a method), its errors (SPMD407)
    reported at the call."""
    if _DEPTH[0] >= DEPTH or id(defn) in _ACTIVE or len(positional) > len(defn.arguments) \
            or (isinstance(defn, LambdaExpr) and not user_code(ctx.api)) \
            or (isinstance(defn, FuncDef) and not has_body(ctx.api, defn)):
        return
    declared = get_proper_type(defn.type) if defn.type is not None else None
    if isinstance(declared, CallableType) and declared.variables:
        return
    types = [positional[i] if i < len(positional) else
             declared.arg_types[i] if isinstance(declared, CallableType) else any_type()
             for i in range(len(defn.arguments))]
    VMAPPED[0] += 1
    try:  # a lambda's body was checked where it stands: only what vmap adds is new
        _report(ctx, defn, types, _VMAP_CODES if isinstance(defn, LambdaExpr) else _RULE_CODES)
    finally:
        VMAPPED[0] -= 1


def _key(defn: FuncItem, types: list[Type]) -> tuple[int, bool, tuple[str, ...]]:
    return id(defn), VMAPPED[0] > 0, tuple(str(t) for t in types)


def _report(ctx: FunctionContext | MethodContext, defn: FuncItem, types: list[Type],
            only: frozenset[Any] = _RULE_CODES) -> None:
    """Check `defn`'s body on `types` (once per run: `_MEMO`) and report its rule errors (of
    the codes `only`) at the call, each naming the line in the body where the rule is broken."""
    key = _key(defn, types)
    memo = _MEMO.get(key)
    if memo is None or memo[0] is not defn:
        result, errors = _recheck(ctx.api, defn, types)
        memo = _MEMO[key] = (defn, result, errors)
    for severity, message, code, line in memo[2]:
        if code not in only:
            continue
        if severity == "error":  # a helper's helper: `in f (line 4) -> g (line 10), ...`
            where = _where(ctx.api, defn, line)
            text = f"in {where} -> {message[3:]}" if message.startswith(_PREFIX) \
                else f"in {where}, on this call's arguments: {message}"
            ctx.api.fail(text, ctx.context, code=code)
        else:
            ctx.api.msg.note(message, ctx.context, code=code)


def mentions(defn: FuncItem, fullnames: frozenset[str]) -> bool:
    """Whether the body of `defn` names one of `fullnames` (in its statements' expressions,
    not in nested functions)."""
    for e in _Saved(defn).expressions:
        names, members = all_name_and_member_expressions(e)
        if any(n.fullname in fullnames for n in (*names, *members)):
            return True
    return False


def user_code(api: Any) -> bool:
    """Whether the module being checked is the user's (a lambda in it has its body)."""
    return _user_module(api, getattr(api, "path", ""))


def _user_module(api: Any, path: str) -> bool:
    """A module of the user's (not site-packages: JAX's, equinox's own code)."""
    path = "/" + path.replace("\\", "/")
    return "/site-packages/" not in path and "/dist-packages/" not in path and "/typeshed/" not in path


def has_body(api: Any, defn: FuncDef) -> bool:
    """Whether `defn` is of a user module analysed in this run (one read from mypy's cache has
    no body to check)."""
    module, name = defn.fullname, ""
    modules = getattr(api, "modules", {})
    while module and module not in modules:
        module, _, name = module.rpartition(".")
    tree = modules.get(module)
    if tree is None or not _user_module(api, tree.path) or tree.is_cache_skeleton:
        return False
    try:
        return bool(defn.body.body) and len(defn.arguments) == len(defn.arg_kinds)
    except AttributeError:  # a node read from the cache: no body
        return False


def _where(api: Any, defn: FuncItem, line: int) -> str:
    """`add_bias` (line 4): the helper and the line of its body where a rule is broken, with
    the module where it is another one's."""
    if isinstance(defn, LambdaExpr):
        return f"the lambda (line {line})"
    name = f"{defn.info.name}.{defn.name}" if is_method(defn) else defn.name
    module = defn.fullname.rpartition("." + name)[0] if defn.fullname else ""
    here = getattr(getattr(api, "tree", None), "fullname", None)
    at = f"line {line}" if not module or module == here else f"{module} line {line}"
    return f"`{name}` ({at})"


def _recheck(api: Any, defn: FuncItem, types: list[Type]) -> tuple[Type | None, list[_Found]]:
    """The body of `defn` checked with parameter types `types`: its return type (None where
    a return is unknown or `Any`) and the rule errors found in it (severity, message, code,
    line)."""
    override = CallableType(types, list(defn.arg_kinds), list(defn.arg_names), any_type(),
                            named(api, "builtins.function", []), name=defn.name,
                            definition=defn if isinstance(defn, FuncDef) else None)
    saved = _Saved(defn)
    _DEPTH[0] += 1
    _ACTIVE.add(id(defn))
    try:
        with api.msg.filter_errors(save_filtered_errors=True) as watcher, \
                api.local_type_map as type_map, api.tscope.function_scope(defn):
            api.check_func_item(defn, type_override=override, name=defn.name)
        found = watcher.filtered_errors()
    except Exception:  # noqa: BLE001 - internal API: mypy's own result
        return None, []
    finally:
        _DEPTH[0] -= 1
        _ACTIVE.discard(id(defn))
        saved.restore()
    # a block that may not run on these arguments (`if reduced:` of a flag the caller does not
    # pass as a literal, a shape test, a loop) is not reported: only what the helper does on
    # every path it takes on them
    uncertain = saved.uncertain(type_map)
    errors = [(e.severity, e.message, e.code, e.line) for e in found if e.code in _RULE_CODES
              and defn.line <= e.line <= (defn.end_line or e.line)
              and not any(a <= e.line <= b for a, b in uncertain)]
    if not any(s == "error" for s, _, _, _ in errors):
        errors = []
    # the returns mypy reached (a literal argument's branch not taken is not), all of one type
    rets = [get_proper_type(type_map[r.expr]) for r in saved.returns if r.expr in type_map]
    if not rets or any(_imprecise(r) for r in rets) or len({str(r) for r in rets}) > 1:
        return None, errors  # a return of unknown type, or of several: mypy's own Any
    return rets[0], errors


def _span(block: Block) -> tuple[int, int]:
    return block.body[0].line, max(s.end_line or s.line for s in block.body)


def _taken(node: IfStmt, type_map: dict[Expression, Type]) -> int | None:
    """The block (0: the body, 1: the `else`) an `if` takes whenever it runs on the re-check's
    arguments, else None: its condition of a literal bool type (`if reduced:` of a literal
    argument), or the other block left unchecked by mypy (unreachable: `if how == "sum":` of
    `how="sum"`, with an `else`)."""
    if len(node.body) != 1:
        return None
    cond = type_map.get(node.expr[0])
    p = get_proper_type(cond) if cond is not None else None
    if isinstance(p, Instance) and p.last_known_value is not None:
        p = p.last_known_value
    if isinstance(p, LiteralType) and isinstance(p.value, bool):
        return 0 if p.value else 1
    body, other = _reached(node.body[0], type_map), _reached(node.else_body, type_map)
    if body is True and other is False:
        return 0
    return 1 if body is False and other is True else None


def _reached(block: Block | None, type_map: dict[Expression, Type]) -> bool | None:
    """Whether mypy checked a block (its first statement with an expression has a type),
    None where that cannot be read."""
    for stmt in block.body if block is not None else []:
        expr = stmt.rvalue if isinstance(stmt, AssignmentStmt) else \
            stmt.expr[0] if isinstance(stmt, IfStmt) else getattr(stmt, "expr", None)
        if isinstance(expr, Expression):
            return expr in type_map
    return None


class _Saved:
    """What a re-check writes into the helper's nodes, read before and put back after: the
    inferred types of its parameters and locals, its `expanded` items; and its returns."""

    def __init__(self, defn: FuncItem) -> None:
        self.defn = defn
        self.returns: list[ReturnStmt] = []
        self.expressions: list[Expression] = []  # returned, assigned and evaluated ones
        #: the lines of the blocks that may not run (loops, `except` / `else` of a try): first,
        #: last; and the `if` statements (`uncertain`: which of their blocks may not run)
        self.branches: list[tuple[int, int]] = []
        self.ifs: list[IfStmt] = []
        self.vars: dict[int, tuple[Var, Any]] = {}
        for a in defn.arguments:
            self.vars[id(a.variable)] = (a.variable, a.variable.type)
        self._walk(defn.body)
        self.expanded = list(defn.expanded)

    def _walk(self, node: Statement | None) -> None:
        """The body's statements, not those of the functions or lambdas in it."""
        if isinstance(node, ReturnStmt) and node.expr is not None:
            self.returns.append(node)
            self.expressions.append(node.expr)
        elif isinstance(node, ExpressionStmt):
            self.expressions.append(node.expr)
        targets: list[Expression] = []
        blocks: list[Statement | None] = []
        if isinstance(node, Block):
            blocks = list(node.body)
        elif isinstance(node, AssignmentStmt):
            targets = list(node.lvalues)
            self.expressions.append(node.rvalue)
        elif isinstance(node, IfStmt):
            blocks = [*node.body, node.else_body]
        elif isinstance(node, ForStmt):
            blocks, targets = [node.body, node.else_body], [node.index]
        elif isinstance(node, WhileStmt):
            blocks = [node.body, node.else_body]
        elif isinstance(node, WithStmt):
            blocks, targets = [node.body], [t for t in node.target if t is not None]
        elif isinstance(node, TryStmt):
            blocks = [node.body, *node.handlers, node.else_body, node.finally_body]
        if isinstance(node, IfStmt):
            self.ifs.append(node)
        elif isinstance(node, ForStmt | WhileStmt):
            self.branches.extend(_span(b) for b in blocks if isinstance(b, Block) and b.body)
        elif isinstance(node, TryStmt):  # its body and `finally` run whenever the try does
            self.branches.extend(_span(b) for b in (*node.handlers, node.else_body)
                                 if isinstance(b, Block) and b.body)
        while targets:
            t = targets.pop()
            if isinstance(t, TupleExpr | ListExpr):
                targets.extend(t.items)
            elif isinstance(t, StarExpr):
                targets.append(t.expr)
            elif isinstance(t, NameExpr) and isinstance(t.node, Var) and id(t.node) not in self.vars:
                self.vars[id(t.node)] = (t.node, t.node.type)
        for b in blocks:
            self._walk(b)

    def uncertain(self, type_map: dict[Expression, Type]) -> list[tuple[int, int]]:
        """The lines of the blocks that may not run whenever the helper runs on the re-check's
        arguments (`branches`, and each `if`'s blocks but the one it is sure to take)."""
        spans = list(self.branches)
        for node in self.ifs:
            taken = _taken(node, type_map)
            spans.extend(_span(b) for i, b in enumerate([*node.body, node.else_body])
                         if b is not None and b.body and i != taken)
        return spans

    def restore(self) -> None:
        for var, t in self.vars.values():
            var.type = t
        self.defn.expanded[:] = self.expanded


#: (id of the function or lambda, under jax.vmap, argument types) -> (it, result, errors): once
#: per run
_MEMO: Final[dict[tuple[int, bool, tuple[str, ...]], tuple[FuncItem, Type | None, list[_Found]]]] = {}
_DEPTH: Final = [0]
#: inside the body of a function `jax.vmap` maps (`check_vmapped`): its gradients are per-example
VMAPPED: Final = [0]
_ACTIVE: Final[set[int]] = set()
