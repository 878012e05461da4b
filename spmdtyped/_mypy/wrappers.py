"""Calls through wrappers that keep the function: `jax.jit(f)(x)` and `functools.partial(f, ...)(x)`.

When `f` is an spmdtyped function the plugin has a hook for (`st.psum`, `st.numpy.tanh`, a
custom op, ...), the call is analysed as the direct call `f(*bound, x)`: same errors, same
result state. The wrapper is read from the callee expression itself, or from the one
assignment `g = jax.jit(f)` / `g = functools.partial(f, ...)` of the name in the enclosing
function (or module). Anything else keeps the wrapper's declared result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from mypy.argmap import map_actuals_to_formals
from mypy.nodes import ARG_POS, CallExpr, Expression, NameExpr, RefExpr
from mypy.plugin import FunctionContext, MethodContext
from mypy.plugins.functools import partial_call_callback
from mypy.types import CallableType, Instance, Overloaded, Type, get_proper_type

from . import names
from .extents import assignments

JIT: Final = frozenset({"jax.jit", "jax._src.api.jit", "jax._src.pjit.jit"})
PARTIAL: Final = frozenset({"functools.partial"})
#: the methods a call of the wrapper's result goes through
METHODS: Final = names.WRAPPED_CALLS

FunctionHook = Callable[[FunctionContext], Type]


def _assigned(api: Any, name: NameExpr) -> CallExpr | None:
    """The call assigned to `name`, when it is assigned exactly once in the enclosing scope."""
    found = assignments(api, name)
    if len(found) != 1 or found[0][1] is not None:
        return None
    value = found[0][0]
    return value if isinstance(value, CallExpr) else None


def _wrapper(api: Any, callee: Expression) -> CallExpr | None:
    call = callee if isinstance(callee, CallExpr) else (
        _assigned(api, callee) if isinstance(callee, NameExpr) else None)
    if call is None or not isinstance(call.callee, RefExpr):
        return None
    if call.callee.fullname in JIT | PARTIAL and call.args and call.arg_kinds[0] == ARG_POS:
        return call
    return None


def _type(api: Any, expr: Expression) -> Type:
    try:
        t: Type = api.lookup_type(expr)  # already checked: no second report
    except KeyError:
        t = api.expr_checker.accept(expr)
    return t


def analyze(ctx: MethodContext, hooks: Callable[[str], FunctionHook | None]) -> Type:
    """The wrapped function's own hook on the merged arguments, else the declared result."""
    default = ctx.default_return_type
    self_type = get_proper_type(ctx.type)
    if isinstance(self_type, Instance) and self_type.type.fullname == "functools.partial":
        default = partial_call_callback(ctx)   # mypy's own checks of the partial's call
    call = ctx.context
    if not isinstance(call, CallExpr):
        return default
    wrapper = _wrapper(ctx.api, call.callee)
    if wrapper is None:
        return default
    inner = wrapper.args[0]
    if not isinstance(inner, RefExpr) or not inner.fullname:
        return default
    hook = hooks(inner.fullname)
    callee = get_proper_type(_type(ctx.api, inner))
    if isinstance(callee, Overloaded):  # the overloads share their parameters (the static view)
        callee = callee.items[0]
    if hook is None or not isinstance(callee, CallableType):
        return default
    # partial binds its other arguments to f; jit's keywords are jit's own
    is_partial = isinstance(wrapper.callee, RefExpr) and wrapper.callee.fullname in PARTIAL
    bound = len(wrapper.args) if is_partial else 1
    exprs = list(wrapper.args[1:bound]) + list(call.args)
    kinds = list(wrapper.arg_kinds[1:bound]) + list(call.arg_kinds)
    names = list(wrapper.arg_names[1:bound]) + list(call.arg_names)
    types = [_type(ctx.api, e) for e in exprs]
    formal_to_actual = map_actuals_to_formals(kinds, names, callee.arg_kinds, callee.arg_names,
                                              lambda i: types[i])
    fctx = FunctionContext(
        arg_types=[[types[i] for i in acts] for acts in formal_to_actual],
        arg_kinds=[[kinds[i] for i in acts] for acts in formal_to_actual],
        callee_arg_names=list(callee.arg_names),
        arg_names=[[names[i] for i in acts] for acts in formal_to_actual],
        default_return_type=callee.ret_type,
        args=[[exprs[i] for i in acts] for acts in formal_to_actual],
        context=call, api=ctx.api)
    return hook(fctx)
