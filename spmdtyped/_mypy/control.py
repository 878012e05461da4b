"""Control flow: `st.fori_loop`, `while_loop`, `scan`, `cond`, `switch`. Result types come from
the declared types of the bodies/branches, joined with `_rules.join_carry` as the runtime joins
them, and made Varying on the axes a trip count, condition or predicate varies over (as
`_control`). Where a body's result is not known (an unannotated body, a lambda over Any), the
result stays Any: the runtime may widen the carry, and the initial carry's type would be too
narrow. The signature hook gives lambda bodies the carry's (operands') types."""

from __future__ import annotations

from typing import Any, Final

from mypy.nodes import (
    ARG_POS,
    Expression,
    FloatExpr,
    IntExpr,
    LambdaExpr,
    ListExpr,
    MemberExpr,
    NameExpr,
    TupleExpr,
)
from mypy.plugin import FunctionContext, FunctionSigContext
from mypy.subtypes import is_same_type
from mypy.types import CallableType, FunctionLike, TupleType, Type, get_proper_type

from .. import _rules
from .._errors import SpmdTypeError
from .._rules import SpmdType
from . import names
from .codes import report
from .convert import any_type, arg, arg_type, from_spmd, is_scalar, named, to_operand, tuple_items, tuple_of

#: full name -> construct
FULLNAMES: Final = names.CONTROL
class _Join(Exception):
    """Two carry/output types the plugin cannot join statically (unknown leaves, structures)."""


def _join_types(api: Any, a: Type, b: Type, *, op: str, what: str,
                labels: tuple[str, str]) -> Type:
    """The join of two (pytrees of) typed values by free casts (`_rules.join_carry`); raises
    `_Join` when a leaf is unknown, `SpmdTypeError` (SPMD302) when no free cast joins them."""
    pa, pb = get_proper_type(a), get_proper_type(b)
    if isinstance(pa, TupleType):
        items = tuple_items(pb, len(pa.items))
        if items is None:
            raise _Join
        return pa.copy_modified(items=[_join_types(api, x, y, op=op, what=f"{what}[{i}]", labels=labels)
                                       for i, (x, y) in enumerate(zip(pa.items, items, strict=True))])
    if isinstance(pb, TupleType):
        return _join_types(api, b, a, op=op, what=what, labels=(labels[1], labels[0]))
    ta, tb = to_operand(pa), to_operand(pb)
    if not (isinstance(ta, SpmdType) and isinstance(tb, SpmdType)):
        raise _Join
    return from_spmd(api, _rules.join_carry(ta, tb, op=op, what=what, labels=labels))


def _widen(api: Any, t: Type, varying: frozenset[str], *, op: str, what: str, kind: str) -> Type:
    """Every leaf made Varying on `varying`: devices may take different paths under a `kind`
    ("trip count", "condition", "predicate") that varies there (as `_control._pred_join`)."""
    if not varying:
        return t
    p = get_proper_type(t)
    if isinstance(p, TupleType):
        return p.copy_modified(items=[_widen(api, i, varying, op=op, what=f"{what}[{k}]", kind=kind)
                                      for k, i in enumerate(p.items)])
    o = to_operand(p)
    if not isinstance(o, SpmdType):
        raise _Join
    labels = ("in the branches" if kind == "predicate" else "in the loop",
              f"under a {kind} Varying over {sorted(varying)}")
    return from_spmd(api, _rules.join_carry(o, o.with_states(varying, _rules.V), op=op, what=what,
                                            labels=labels))


def _predicate_varying(t: Type | None) -> frozenset[str]:
    """The axes a predicate / trip count / index of type `t` varies over (`_Join`: unknown)."""
    if t is None:
        return frozenset()
    p = get_proper_type(t)
    if is_scalar(p):
        return frozenset()
    o = to_operand(p)
    if not isinstance(o, SpmdType):
        raise _Join
    return _rules.predicate_type(o).varying


def _ret(t: Type | None) -> Type:
    p = get_proper_type(t) if t is not None else None
    if not isinstance(p, CallableType):
        raise _Join
    return p.ret_type


def _stable(ctx: FunctionContext, body: str, init: Type, joined: Type) -> Type:
    """A lambda body was inferred on the initial carry's types: its result is exact only if the
    carry did not widen (the runtime retraces it on the widened carry); else unknown."""
    b = arg(ctx, body)
    if b is not None and isinstance(b[0], LambdaExpr) and not is_same_type(init, joined):
        raise _Join
    return joined


_BODY_LABELS: Final = ("before the body", "after the body")


def analyze(ctx: FunctionContext, name: str) -> Type:
    """The result type of `st.<name>(...)` (Any where a body's result is unknown)."""
    try:
        return _result(ctx, name)
    except _Join:
        return ctx.default_return_type
    except SpmdTypeError as err:
        report(ctx.api, err, ctx.context)
        return ctx.default_return_type


def _result(ctx: FunctionContext, name: str) -> Type:
    op = f"st.{name}"
    default = ctx.default_return_type
    api = ctx.api
    if name == "fori_loop":
        init = arg_type(ctx, "init_val")
        if init is None:
            return default
        varying = _predicate_varying(arg_type(ctx, "lower")) | _predicate_varying(arg_type(ctx, "upper"))
        carry = _widen(api, init, varying, op=op, what="init_val", kind="trip count")
        return _stable(ctx, "body_fun", carry, _join_types(
            api, carry, _ret(arg_type(ctx, "body_fun")), op=op, what="init_val",
            labels=_BODY_LABELS))
    if name == "while_loop":
        init = arg_type(ctx, "init_val")
        if init is None:
            return default
        carry = _stable(ctx, "body_fun", init, _join_types(
            api, init, _ret(arg_type(ctx, "body_fun")), op=op, what="init_val",
            labels=_BODY_LABELS))
        varying = _predicate_varying(_ret(arg_type(ctx, "cond_fun")))
        return _widen(api, carry, varying, op=op, what="init_val", kind="condition")
    if name == "scan":
        init = arg_type(ctx, "init")
        if init is None:
            return default
        out = tuple_items(_ret(arg_type(ctx, "f")), 2)
        if out is None:
            return default
        carry = _stable(ctx, "f", init, _join_types(api, init, out[0], op=op, what="init",
                                                    labels=_BODY_LABELS))
        return tuple_of(api, [carry, out[1]])
    # cond / switch: the branches' outputs joined, widened by a varying predicate
    if name == "cond":
        fns: list[Type | None] = [arg_type(ctx, "true_fun"), arg_type(ctx, "false_fun")]
        pred = arg_type(ctx, "pred")
    else:
        branches = arg(ctx, "branches")
        if branches is None or not isinstance(branches[0], (ListExpr, TupleExpr)):
            return default
        # as inferred with the signature hook's context (lambdas on typed operands)
        fns = [api.lookup_type(e) if api.has_type(e) else api.get_expression_type(e, None)
               for e in branches[0].items]
        pred = arg_type(ctx, "index")
    if not fns:
        return default
    out_t = _ret(fns[0])
    for k, fn in enumerate(fns[1:], 1):
        out_t = _join_types(api, out_t, _ret(fn), op=op, what="output",
                            labels=(f"in branch {', '.join(map(str, range(k)))}",
                                    f"in branch {k}"))
    varying = _predicate_varying(pred)
    return _widen(api, out_t, varying, op=op, what="output", kind="predicate")


def _simple_type(api: Any, expr: Expression | None) -> Type | None:
    """The type of an argument whose inference has no side effects (names, attributes of
    names, literals, tuples of them): safe to infer once more for a signature hook."""
    if isinstance(expr, TupleExpr):
        items = [_simple_type(api, i) for i in expr.items]
        if any(i is None for i in items):
            return None
        return tuple_of(api, [i for i in items if i is not None])
    if isinstance(expr, (NameExpr, IntExpr, FloatExpr)) or (
            isinstance(expr, MemberExpr) and isinstance(expr.expr, NameExpr)):
        return api.get_expression_type(expr, None)  # type: ignore[no-any-return]
    return None


def signature(ctx: FunctionSigContext, name: str) -> FunctionLike:
    """Give the bodies/branches of `st.<name>` the carry's (operands') types as parameter types,
    so that a lambda body is inferred on typed values (`lambda i, c: c + x`)."""
    sig = ctx.default_signature
    names = sig.arg_names
    any_t = any_type()

    def expr(param: str) -> Expression | None:
        i = names.index(param) if param in names else -1
        return ctx.args[i][0] if i >= 0 and len(ctx.args[i]) == 1 else None

    def fn(params: list[Type]) -> CallableType:
        return CallableType(params, [ARG_POS] * len(params), [None] * len(params), any_t,
                            named(ctx.api, "builtins.function", []))

    bodies: dict[str, Type] = {}
    if name in ("fori_loop", "while_loop"):
        init = _simple_type(ctx.api, expr("init_val"))
        if init is None:
            return sig
        if name == "fori_loop":
            bodies["body_fun"] = fn([any_t, init])
        else:
            bodies["body_fun"] = bodies["cond_fun"] = fn([init])
    elif name == "scan":
        init = _simple_type(ctx.api, expr("init"))
        xs = expr("xs")
        x_t = _simple_type(ctx.api, xs) if xs is not None else any_t
        if init is None or x_t is None:
            return sig
        bodies["f"] = fn([init, x_t])
    else:  # cond / switch: the branches take the operands
        if "operands" not in names:
            return sig
        ops = [_simple_type(ctx.api, e) for e in ctx.args[names.index("operands")]]
        if not ops or any(o is None for o in ops):
            return sig
        branch = fn([o for o in ops if o is not None])
        if name == "cond":
            bodies["true_fun"] = bodies["false_fun"] = branch
        else:
            bodies["branches"] = named(ctx.api, "typing.Sequence", [branch])

    def is_lambda(param: str) -> bool:
        # only lambdas take the context: a `def` body keeps its own annotations, which may
        # be wider than the initial carry (the runtime casts the carry, e.g. Reduced ->
        # Varying)
        if param == "branches":
            e = expr(param)
            return isinstance(e, (ListExpr, TupleExpr)) and bool(e.items) and \
                all(isinstance(i, LambdaExpr) for i in e.items)
        return isinstance(expr(param), LambdaExpr)

    types = [bodies[n] if n in bodies and is_lambda(n) else t
             for n, t in zip(names, sig.arg_types, strict=True)]
    return sig.copy_modified(arg_types=types)
