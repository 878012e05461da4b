"""`spmd-unknown` (opt-in): the first place where a typed value's state is lost, with the reason.

On with `unknown = true` in `[spmdtyped]` (`[tool.spmdtyped]` in pyproject.toml), with
`enable_error_code = spmd-unknown`, or with `python -m spmdtyped check --strict`. Off, nothing
here runs: the entry point wraps no hook.

Every call and method hook of the entry point (and, while it is on, every call of a name that
has none) goes through `watch`: where an argument (or the receiver) is a typed value of known
state and the result is not (it is `Any`, a plain `jax.Array`, or `SArray` of unknown state),
and no rule error was reported there, the call is reported once, with why:

- a call with no rule: a JAX function without a surface row (`jnp.foo`), a user function
  without annotations or declared to return a plain array, any other library function;
- a form with a rule whose other operand has no state: `Any` (an unannotated parameter), a plain
  `jax.Array` that is not a constant (an un-hinted module field `self.w`, an unknown call's
  result);
- a refinement (Shard / Partial / Rep on an axis) the result no longer has on an axis it still
  varies over (`x.reshape(...)`: the plugin cannot follow its dims).

Once per value chain: the lost result is marked (a fresh `Any` / `jax.Array` object, which
mypy keeps for the variable it is assigned to and as the source of the `Any`s computed from
it); an operand so marked, or already `SArray` of unknown state, is not reported again.
`jax.tree.map` with a tree of unknown leaves and a lambda that calls spmdtyped is `tree_map`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, Final

from mypy.nodes import (
    CallExpr,
    ConditionalExpr,
    Context,
    Expression,
    FuncDef,
    IndexExpr,
    LambdaExpr,
    ListExpr,
    MemberExpr,
    NameExpr,
    OpExpr,
    RefExpr,
    TempNode,
    TupleExpr,
    UnaryExpr,
)
from mypy.plugin import FunctionContext, MethodContext
from mypy.types import AnyType, Instance, TupleType, Type, TypeOfAny, UnionType, get_proper_type

from .._rules import SpmdType
from .._rules import refine as _refine
from . import codes, refined
from .config import CONFIG
from .convert import SARRAY, state_of_args

_JAX_ARRAY: Final = "jax._src.basearray.Array"
#: containers whose items a lost array may be (`jnp.split` gives `list[Array]`)
_CONTAINERS: Final = frozenset({"builtins.list", "builtins.tuple", "builtins.dict"})
#: JAX's modules whose functions the surface table has rows for (`jnp.foo`: "no surface row")
_ROW_MODULES: Final = ("jax.numpy.", "jax.nn.", "jax.lax.", "jax._src.numpy.", "jax._src.nn.",
                       "jax._src.lax.")
#: the results reported in this run (their ids; the objects are held so the ids stay theirs)
_MARKED: Final[dict[int, Type]] = {}


def enabled(options: Any) -> bool:
    """Whether `spmd-unknown` is on (the `[spmdtyped]` key or mypy's `enable_error_code`)."""
    return CONFIG.unknown or codes.UNKNOWN in getattr(options, "enabled_error_codes", ())


Hook = Callable[[Any], Type]


def watch(hook: Hook | None, fullname: str, node: Callable[[str], Any]) -> Hook | None:
    """`hook` (None: mypy's own result), then the lost-state check of its call (None: a name
    `_others` leaves alone, without a hook of ours)."""

    if hook is None and _others(fullname):
        return None

    def watched(ctx: FunctionContext | MethodContext) -> Type:
        if _installed(getattr(ctx.api, "path", "")):
            return hook(ctx) if hook is not None else ctx.default_return_type
        if not _typed_inputs(ctx):  # a lost chain stays marked through plain calls
            out = hook(ctx) if hook is not None else ctx.default_return_type
            marked = any(_marked(t) or _is_unknown_sarray(t) for t in _operand_types(ctx))
            return _mark(out) if marked and _lost(out) else out
        before = (codes.REPORTED[0], ctx.api.msg.errors.num_messages())
        out = hook(ctx) if hook is not None else ctx.default_return_type
        if (codes.REPORTED[0], ctx.api.msg.errors.num_messages()) != before or _errors_here(ctx):
            return out  # a rule error (or mypy's) at the call or its line: that is what to fix
        typed = _typed_inputs(ctx)
        if _lost(out):
            why = _why(ctx, fullname, hook is not None, node)
            if why is None:  # an operand of a chain already reported (or already unknown):
                return _mark(out)  # the result is of the same chain
            _fail(ctx, fullname, f"{why}: the result of {_a(typed[0])} value is {_describe(out)} "
                                 "from here")
            return _mark(out)
        if hook is not None and fullname.startswith(("spmdtyped.", "jax")):  # the rules' forms
            _dropped(ctx, out, fullname)
        return out

    return watched


def _fail(ctx: FunctionContext | MethodContext, fullname: str, msg: str) -> None:
    """Report `msg`; from an operator's method past mypy's filter of that direction (an error
    there would make mypy try the other direction and type the expression `Any`)."""
    def emit() -> None:
        ctx.api.fail(msg, ctx.context, code=codes.UNKNOWN)

    if isinstance(ctx.context, OpExpr) and fullname.startswith(f"{SARRAY}.__"):
        codes.past_operator_fallback(ctx.api, emit)
    else:
        emit()


def _a(text: str) -> str:
    return f"an {text}" if text[:1] in "AEIOU" else f"a {text}"


def _errors_here(ctx: FunctionContext | MethodContext) -> bool:
    """Whether an error was reported on the call's line already (in its arguments, which mypy
    checks before the hook runs: the lost state is that error's consequence)."""
    try:
        errors = ctx.api.msg.errors
        infos = errors.error_info_map.get(errors.file, ())
    except Exception:  # noqa: BLE001 - internal API: nothing known
        return False
    line = ctx.context.line
    return any(i.line == line and i.severity == "error" for i in infos)


def _others(fullname: str) -> bool:
    """Names left to mypy and its other plugins (a plugin's hook shadows those of the plugins
    after it, mypy's default plugin among them: `functools.partial`, `dataclasses.replace`,
    `len`): the standard library's, attrs', and mypy's pseudo-functions of displays (`<list>`)."""
    top = fullname.partition(".")[0]
    return fullname.startswith("<") or top in sys.stdlib_module_names or top in ("attr", "attrs")


def _installed(path: str) -> bool:
    """A module of site-packages (JAX's, equinox's own code calling itself): not the user's."""
    path = "/" + path.replace("\\", "/")
    return "/site-packages/" in path or "/dist-packages/" in path


def _typed_inputs(ctx: FunctionContext | MethodContext) -> list[str]:
    """The typed values of known state the call takes (the receiver first), as text."""
    out = []
    for t in _operand_types(ctx):
        p = get_proper_type(t)
        if isinstance(p, Instance) and p.type.fullname == SARRAY:
            state = state_of_args(p.args)
            if state is not None:
                ref, _ = refined.read(p)
                out.append(_refine.describe(state, ref))
    return out


def _operand_types(ctx: FunctionContext | MethodContext) -> list[Type]:
    """The receiver's type (a method) and the arguments' types."""
    types: list[Type] = [ctx.type] if isinstance(ctx, MethodContext) else []
    return types + [t for ts in ctx.arg_types for t in ts]


def _lost(t: Type, depth: int = 0) -> bool:
    """Whether a result is array-like with no state: `Any`, `jax.Array`, `SArray[Any, ...]`
    (or a tuple / list / dict of such, one level deep)."""
    p = get_proper_type(t)
    if isinstance(p, AnyType):
        return p.type_of_any != TypeOfAny.from_error
    if isinstance(p, Instance):
        if p.type.fullname == SARRAY:
            return state_of_args(p.args) is None
        if p.type.fullname == _JAX_ARRAY:
            return True
        return depth == 0 and p.type.fullname in _CONTAINERS and any(_lost(a, 1) for a in p.args)
    if isinstance(p, UnionType):
        return any(_lost(i, depth) for i in p.items)
    if isinstance(p, TupleType):
        return depth == 0 and any(_lost(i, 1) for i in p.items)
    return False


def _describe(t: Type) -> str:
    p = get_proper_type(t)
    if isinstance(p, AnyType):
        return "Any"
    if isinstance(p, Instance) and p.type.fullname == _JAX_ARRAY:
        return "a plain jax.Array"
    if isinstance(p, Instance) and p.type.fullname == SARRAY:
        return "SArray of unknown state"
    items = p.items if isinstance(p, (TupleType, UnionType)) else \
        p.args if isinstance(p, Instance) else ()
    lost = next((i for i in items if _lost(i, 1)), None)
    if lost is not None:
        kind = "a tuple" if isinstance(p, TupleType) else "a union" if isinstance(p, UnionType) \
            else f"a {p.type.name}" if isinstance(p, Instance) else "a value"
        return f"{kind} holding {_describe(lost)}"
    return f"{p} (no state)"


def _mark(t: Type) -> Type:
    """A fresh copy of a lost result, remembered: the operands computed from it are not
    reported again (`SArray` of unknown state needs no mark: it is never reported again)."""
    p = get_proper_type(t)
    if isinstance(p, AnyType):
        root = p.source_any or p
        new: Type = AnyType(root.type_of_any, missing_import_name=root.missing_import_name)
    elif isinstance(p, Instance) and p.type.fullname == _JAX_ARRAY:
        new = p.copy_modified()
    else:
        return t
    if len(_MARKED) > 65536:
        _MARKED.clear()
    _MARKED[id(new)] = new
    return new


def _marked(t: Type) -> bool:
    p = get_proper_type(t)
    if isinstance(p, AnyType):
        p = p.source_any or p
    return _MARKED.get(id(p)) is p


# ------------------------------------------------------------------------------ the reasons


def label(fullname: str) -> str:
    """As users write the name: `jax._src.numpy.ufuncs.exp` -> `jnp.exp`, `SArray.__add__` ->
    `operator +`, `spmdtyped._static.psum` -> `st.psum`."""
    if fullname.startswith("jax"):
        from .jax_forms import label as jax_label

        return jax_label(fullname)
    if fullname.startswith(f"{SARRAY}."):
        from .operators import BINARY

        method = fullname.rpartition(".")[2]
        return BINARY[method][2] if method in BINARY else f".{method}()"
    if fullname.startswith("spmdtyped."):
        module, _, name = fullname.rpartition(".")
        public = module.removeprefix("spmdtyped").lstrip(".")
        return f"st.{public}.{name}" if public in ("numpy", "nn", "lax") else f"st.{name}"
    return fullname


def _why(ctx: FunctionContext | MethodContext, fullname: str, has_rule: bool,
         node: Callable[[str], Any]) -> str | None:
    """Why the call's result has no state (None: an operand already lost, reported before)."""
    operand = _unknown_operand(ctx)
    if operand is not None:
        expr, t = operand
        p = get_proper_type(t)
        if _marked(t) or _is_unknown_sarray(t) or (isinstance(p, AnyType)
                                                    and p.type_of_any == TypeOfAny.from_error):
            return None
        return f"`{label(fullname)}`: {_operand(expr)} is {_describe(t)}"
    decl = node(fullname)
    if isinstance(decl, FuncDef) and getattr(decl.type, "variables", None):
        return None  # generic: mypy may have solved its type variables from a context's Any
    if any(_non_literal_str(t) for ts in ctx.arg_types for t in ts):
        return f"`{label(fullname)}`: an axis name is not a literal"
    if fullname.startswith("spmdtyped.lax."):
        name = fullname.rpartition(".")[2]
        return f"`st.lax.{name}` returns a raw value (jax.lax's drop-in; `st.{name}` is typed)"
    if (has_rule and (fullname.startswith(("spmdtyped.", "jax")) or not isinstance(decl, FuncDef))) \
            or fullname.startswith("st."):  # a function spmdtyped typed (`st.grad(loss)`)
        return f"`{label(fullname)}` gives no state here"
    if fullname.startswith(_ROW_MODULES):
        return f"`{label(fullname)}` has no surface row"
    if isinstance(decl, FuncDef) and not _library(ctx.api, fullname):
        if decl.type is None:
            return f"`{decl.name}` has no annotations"
        ret = get_proper_type(getattr(decl.type, "ret_type", None))
        text = "Any" if isinstance(ret, AnyType) else ret.type.name if isinstance(ret, Instance) else str(ret)
        return f"`{decl.name}` is declared to return {text}"
    return f"`{label(fullname)}` is not known to spmdtyped"


def _non_literal_str(t: Type) -> bool:
    p = get_proper_type(t)
    return isinstance(p, Instance) and p.type.fullname == "builtins.str" and p.last_known_value is None


def _library(api: Any, fullname: str) -> bool:
    """Whether a name is defined in an installed package (its module's file in site-packages)."""
    modules = getattr(api, "modules", {})
    module = fullname
    while "." in module:
        module = module.rpartition(".")[0]
        if module in modules:
            return _installed(modules[module].path)
    return False


def _unknown_operand(ctx: FunctionContext | MethodContext) -> tuple[Expression, Type] | None:
    """The first argument that is array-like with no state (`Any`, a non-constant `jax.Array`,
    `SArray` of unknown state)."""
    from .constants import is_constant

    if isinstance(ctx, MethodContext):  # the receiver (a reflected operator's right operand)
        p = get_proper_type(ctx.type)
        if isinstance(p, AnyType) or _is_unknown_sarray(p):
            return TempNode(p, context=ctx.context), p
    for exprs, types in zip(ctx.args, ctx.arg_types, strict=True):
        for expr, t in zip(exprs, types, strict=True):
            p = get_proper_type(t)
            if isinstance(p, AnyType):  # from an error: `_why` reports no consequence of it
                return expr, t
            if _is_unknown_sarray(p):
                return expr, t
            if isinstance(p, Instance) and p.type.fullname == _JAX_ARRAY \
                    and not is_constant(ctx.api, expr):
                return expr, t
    return None


def _is_unknown_sarray(t: Type) -> bool:
    p = get_proper_type(t)
    return isinstance(p, Instance) and p.type.fullname == SARRAY and state_of_args(p.args) is None


def _operand(expr: Expression) -> str:
    """`its operand `bias``; `its operand `self.rope` (a field with no state hint)`."""
    if isinstance(expr, TempNode):  # a reflected operator's left operand
        return "its other operand"
    if isinstance(expr, MemberExpr) and isinstance(expr.expr, NameExpr) and expr.expr.name == "self":
        return f"its operand `self.{expr.name}` (a field with no state hint)"
    return f"its operand `{_text(expr)}`"


def _text(expr: Expression) -> str:
    if isinstance(expr, MemberExpr):
        return f"{_text(expr.expr)}.{expr.name}"
    if isinstance(expr, NameExpr):
        return expr.name
    if isinstance(expr, CallExpr):
        return f"{_text(expr.callee)}(...)"
    return type(expr).__name__.removesuffix("Expr").lower() or "operand"


# ------------------------------------------------------------------------------ refinements


def _dropped(ctx: FunctionContext | MethodContext, out: Type, fullname: str) -> None:
    """A refinement on an axis the result still varies over, gone from the result."""
    p = get_proper_type(out)
    if not (isinstance(p, Instance) and p.type.fullname == SARRAY):
        return
    state = state_of_args(p.args)
    if state is None:
        return
    kept, _ = refined.read(p)
    kept_axes = {a for a, _ in kept.items}
    types = _operand_types(ctx)
    for t in types:
        ref, _ = refined.read(t)
        for axis, kind in ref.items:
            if axis in state.varying and axis not in kept_axes and _user_kind(kind):
                text = _refine.describe(SpmdType(frozenset((axis,))), ref.restrict(frozenset((axis,))))
                plain = [t for t in types if _plain_on(t, axis)]
                why = f" (its other operand is plain Varying[{axis!r}])" if plain \
                    else " (the plugin does not follow its dims)"
                _fail(ctx, fullname, f"{text} refinement dropped by `{label(fullname)}`{why}: the "
                                     f"result is plain Varying[{axis!r}] from here")
                return


def _plain_on(t: Type, axis: str) -> bool:
    """A typed value that varies over `axis` without a refinement there."""
    p = get_proper_type(t)
    if not (isinstance(p, Instance) and p.type.fullname == SARRAY):
        return False
    state = state_of_args(p.args)
    ref, _ = refined.read(p)
    return state is not None and axis in state.varying and axis not in {a for a, _ in ref.items}


def _user_kind(kind: object) -> bool:
    """Shard / Partial / Rep (the index and owner kinds are the plugin's own)."""
    return isinstance(kind, _refine.Shard) or kind in (_refine.PARTIAL, _refine.REP)


# ------------------------------------------------------------------------------ jax.tree.map


def _calls_spmdtyped(e: Expression | None) -> bool:
    """Whether an expression calls a function of spmdtyped (`st.pmean(g, "dp")`)."""
    if isinstance(e, CallExpr):
        if isinstance(e.callee, RefExpr) and (e.callee.fullname or "").startswith("spmdtyped"):
            return True
        return _calls_spmdtyped(e.callee) or any(_calls_spmdtyped(a) for a in e.args)
    if isinstance(e, OpExpr):
        return _calls_spmdtyped(e.left) or _calls_spmdtyped(e.right)
    if isinstance(e, (UnaryExpr, MemberExpr)):
        return _calls_spmdtyped(e.expr)
    if isinstance(e, IndexExpr):
        return _calls_spmdtyped(e.base) or _calls_spmdtyped(e.index)
    if isinstance(e, (TupleExpr, ListExpr)):
        return any(_calls_spmdtyped(i) for i in e.items)
    if isinstance(e, ConditionalExpr):
        return any(_calls_spmdtyped(i) for i in (e.cond, e.if_expr, e.else_expr))
    return False


def tree_map(api: Any, fn: Expression, tree: Expression, context: Context) -> None:
    """`jax.tree.map(lambda g: st.pmean(g, "dp"), grads)` whose tree has no typed leaf the
    plugin can read: the lambda's parameter is `Any`, and so is every state after it."""
    if not isinstance(fn, LambdaExpr) or not enabled(api.options) \
            or _installed(getattr(api, "path", "")) or not _calls_spmdtyped(fn.expr()):
        return
    params = ", ".join(f"`{a.variable.name}`" for a in fn.arguments) or "its parameters"
    api.fail(f"`jax.tree.map`: the tree `{_text(tree)}` has no typed leaf the plugin can read: "
             f"{params} of the lambda is Any, and so is every state computed from it", context,
             code=codes.UNKNOWN)
