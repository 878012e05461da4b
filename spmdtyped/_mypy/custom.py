"""Custom ops: `st.custom_op(requires=..., produces=...)` and `st.opaque(fn)`, read from source.

The declarations are literal dicts (`{"tp": "varying"}` or `{"x": {"tp": "varying"}}`); the
result state is `_rules.custom_op_type` of the array arguments' states, as at runtime. Three
spellings are seen:

- the decorator `@st.custom_op(requires=...)`: the factory's result becomes the identity on
  the function (so the decorated name keeps a callable type), and a call of the decorated
  function is typed through its declaration (parameters accept typed values);
- `st.custom_op(fn, requires=...)(x)` and `st.opaque(fn)(x)`: a `CustomOp.__call__` whose
  callee expression is the declaring call.

A declaration the plugin cannot read (a variable, a `produces` function), a pytree argument or
an argument of unknown state gives the declared type and no error.
"""

from __future__ import annotations

from typing import Any, Final

from mypy.nodes import ARG_POS, CallExpr, Decorator, DictExpr, Expression, RefExpr, StrExpr
from mypy.plugin import FunctionContext, FunctionSigContext, MethodContext
from mypy.types import AnyType, CallableType, FunctionLike, Type, TypeOfAny, TypeVarId, TypeVarType

from .. import _rules
from .._errors import SpmdTypeError
from .._rules import LITERAL, SpmdType, State
from . import names
from .codes import report
from .convert import from_spmd, named, to_operand

CUSTOM_OP: Final = names.CUSTOM_OP
OPAQUE: Final = names.OPAQUE
CUSTOM_OP_CLASS: Final = names.CUSTOM_OP_CLASS
CALL: Final = names.CUSTOM_CALL


class _Unreadable(Exception):
    pass


def _states(expr: Expression) -> dict[str, str]:
    if not isinstance(expr, DictExpr):
        raise _Unreadable
    out: dict[str, str] = {}
    for k, v in expr.items:
        if not (isinstance(k, StrExpr) and isinstance(v, StrExpr)):
            raise _Unreadable
        out[k.value] = v.value
    return out


class Decl:
    """A custom op's declaration: per-parameter or all-argument requirements, produces."""

    def __init__(self, call: CallExpr, kind: str) -> None:
        self.kind = kind
        self.name = "custom_op"
        self.per_param: dict[str, dict[str, State]] | None = None
        self.all_args: dict[str, State] = {}
        self.produces: dict[str, State] | None = None
        if call.args and call.arg_kinds[0] == ARG_POS and isinstance(call.args[0], RefExpr):
            self.name = getattr(call.args[0], "name", None) or self.name
        for name, a in zip(call.arg_names, call.args, strict=True):
            if name == "requires":
                self._requires(a)
            elif name == "produces":
                self.produces = _rules.parse_states(_states(a), op=self.op, what="produces")
            elif name == "name" and isinstance(a, StrExpr):
                self.name = a.value

    @property
    def op(self) -> str:
        return f"{self.kind}({self.name})"

    def _requires(self, expr: Expression) -> None:
        if not isinstance(expr, DictExpr):
            raise _Unreadable
        if expr.items and all(isinstance(v, DictExpr) for _k, v in expr.items):
            self.per_param = {}
            for k, v in expr.items:
                if not isinstance(k, StrExpr):
                    raise _Unreadable
                self.per_param[k.value] = _rules.parse_states(_states(v), op=self.op,
                                                              what=f"requires[{k.value!r}]")
        else:
            self.all_args = _rules.parse_states(_states(expr), op=self.op, what="requires")


def _declaration(call: Any, kind_of: dict[str, str]) -> Decl | None:
    if not (isinstance(call, CallExpr) and isinstance(call.callee, RefExpr)):
        return None
    kind = kind_of.get(call.callee.fullname or "")
    if kind is None:
        return None
    try:
        return Decl(call, kind)
    except (_Unreadable, SpmdTypeError):  # a malformed declaration raises where it is made
        return None


_KINDS: Final = {**{n: "st.custom_op" for n in CUSTOM_OP}, **{n: "st.opaque" for n in OPAQUE}}


def decorated_declaration(node: Any) -> Decl | None:
    """The declaration of a function decorated with `@st.custom_op(...)`, if any."""
    if not isinstance(node, Decorator):
        return None
    for d in node.decorators:
        decl = _declaration(d, {n: "st.custom_op" for n in CUSTOM_OP})
        if decl is not None:
            decl.name = node.func.name
            return decl
    return None


def _result(api: Any, context: Any, decl: Decl, params: list[str | None],
            args: list[list[Type]], default: Type) -> Type:
    in_types: list[SpmdType] = []
    reqs: list[dict[str, State]] = []
    names: list[str] = []
    for i, types in enumerate(args):
        pname = params[i] if i < len(params) else None
        for t in types:
            o = to_operand(t)
            if o is LITERAL:
                continue  # Python scalars are not array arguments (as at runtime)
            if not isinstance(o, SpmdType):
                return default
            in_types.append(o)
            names.append(pname or f"argument {i}")
            reqs.append((decl.per_param or {}).get(pname or "", {}) if decl.per_param is not None
                        else decl.all_args)
    try:
        out = _rules.custom_op_type(in_types, reqs, decl.produces, op=decl.op, names=names)
    except SpmdTypeError as err:
        report(api, err, context)
        return default
    return from_spmd(api, out)


def analyze_factory(ctx: FunctionContext) -> Type:
    """`st.custom_op(requires=...)` without a function: the identity on the decorated
    function, so that its calls stay visible to the plugin."""
    if ctx.args and ctx.args[0]:
        return ctx.default_return_type
    fn_type = ctx.api.named_generic_type("builtins.function", [])
    obj = ctx.api.named_generic_type("builtins.object", [])
    tv = TypeVarType("F", "F", TypeVarId(-1, namespace="spmdtyped.custom_op"), [], obj,
                     AnyType(TypeOfAny.from_omitted_generics))
    return CallableType([tv], [ARG_POS], [None], tv, fn_type, variables=[tv])


def signature(ctx: FunctionSigContext) -> FunctionLike:
    """A decorated custom op takes typed values: its array parameters accept anything."""
    sig = ctx.default_signature
    if not isinstance(sig, CallableType):
        return sig
    return sig.copy_modified(arg_types=[AnyType(TypeOfAny.special_form)] * len(sig.arg_types))


def analyze_decorated(ctx: FunctionContext, decl: Decl) -> Type:
    # the runtime names arguments by parameter only for per-parameter declarations
    params = list(ctx.callee_arg_names) if decl.per_param is not None else []
    return _result(ctx.api, ctx.context, decl, params, ctx.arg_types, ctx.default_return_type)


def analyze_call(ctx: MethodContext) -> Type:
    """`st.opaque(fn)(x)` / `st.custom_op(fn, requires=...)(x)`."""
    call = ctx.context
    if not isinstance(call, CallExpr):
        return ctx.default_return_type
    decl = _declaration(call.callee, _KINDS)
    if decl is None or decl.per_param is not None:  # per parameter: needs fn's signature
        return ctx.default_return_type
    args = [[t for ts in ctx.arg_types for t in ts]]
    return _result(ctx.api, ctx.context, decl, [None], [[t] for t in args[0]],
                   ctx.default_return_type)


def custom_op_instance(ctx: FunctionContext) -> Type:
    """`st.custom_op(fn, ...)` with the function: a `CustomOp` (its calls go through
    `analyze_call`); the decorator factory: see `analyze_factory`."""
    if ctx.args and ctx.args[0]:
        try:
            return named(ctx.api, CUSTOM_OP_CLASS, [])
        except (KeyError, AssertionError):  # spmdtyped._ops.custom not analysed: keep Any
            return ctx.default_return_type
    return analyze_factory(ctx)
