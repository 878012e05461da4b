"""The shard_map boundary: `st.shard_map(f, out_specs=P(...))` checks `f`'s declared outputs
against the literal out_specs (`_rules.check_out_spec`, SPMD401), reported where the result
is called, as the runtime raises it when the function is called; and the literal in_specs
against `f`'s parameter hints (SPMD403), reported where `st.shard_map` is applied (the
function and the decorator form), which the runtime raises when the function is called.

The specs, the manual axes and `f`'s type travel as type arguments of the static view's
`OutSpecMismatch[S, F, M]` (and `ShardMapDecorator[S, M]` for the decorator form): `S` is a
`StaticSpec[P, U, R]` (P a tuple of the positional entries, each a str Literal, a tuple of
them or None; U, R the unreduced / reduced axes as str Literal unions) or a tuple of specs,
`M` the manual axes (`Never`: every mesh axis)."""

from __future__ import annotations

import dataclasses
from typing import Any, Final

from mypy.nodes import (
    ARG_NAMED,
    ARG_POS,
    CallExpr,
    Decorator,
    Expression,
    ListExpr,
    NameExpr,
    RefExpr,
    SetExpr,
    StrExpr,
    TupleExpr,
)
from mypy.plugin import FunctionContext, MethodContext
from mypy.types import CallableType, Instance, LiteralType, NoneType, TupleType, Type, get_proper_type

from .. import _rules
from .._errors import SpmdTypeError, error
from .._rules import SpmdType
from . import names
from .codes import report
from .convert import STATIC, any_type, arg, axes_of, axes_type, named, str_type, to_operand, tuple_of

OUT_SPEC_MISMATCH: Final = names.OUT_SPEC_MISMATCH
SHARD_MAP_DECORATOR: Final = names.SHARD_MAP_DECORATOR
STATIC_SPEC: Final = f"{STATIC}.StaticSpec"
FUNCTIONS: Final = names.SHARD_MAP
METHODS: Final = names.BOUNDARY_METHODS
_PARTITION_SPEC: Final = frozenset({"jax.sharding.PartitionSpec", "jax._src.partition_spec.PartitionSpec"})

Entry = str | tuple[str, ...] | None


@dataclasses.dataclass(frozen=True)
class Spec:
    """A PartitionSpec read from source."""

    entries: tuple[Entry, ...]
    unreduced: frozenset[str] = frozenset()
    reduced: frozenset[str] = frozenset()

    @property
    def partitioned(self) -> tuple[str, ...]:
        out: list[str] = []
        for e in self.entries:
            out.extend((e,) if isinstance(e, str) else e or ())
        return tuple(out)

    @property
    def text(self) -> str:
        """As the runtime shows it: `P('dp', None)`, `P('dp',)`, `P(unreduced={'tp'})`."""
        shown = ["None" if e is None else repr(e) for e in self.entries]
        extra = {k: v for k, v in (("unreduced", self.unreduced), ("reduced", self.reduced)) if v}
        text = ", ".join(shown) + ("," if len(shown) == 1 and not extra else "")
        text += "".join(f"{', ' if text else ''}{k}={set(sorted(v))!r}" for k, v in extra.items())
        return f"P({text})"


Specs = Spec | list["Specs | None"]


def analyze(ctx: FunctionContext | MethodContext, feature: str) -> Type:
    """`shard_map(...)` itself, a decorator's application (`decorate`), or a call of a
    mismatching shard_map (`call`)."""
    if isinstance(ctx, FunctionContext):
        return _shard_map(ctx)
    if feature == "decorate":
        return _decorate(ctx)
    return _call(ctx)


# ----------------------------------------------------------------------------- reading specs


def str_set(expr: Expression) -> frozenset[str] | None:
    """The axis names of a literal `"dp"`, `{"dp", "tp"}`, `("dp",)`, `frozenset({...})`,
    `set()` (empty); None when not literal."""
    if isinstance(expr, StrExpr):
        return frozenset((expr.value,))
    if isinstance(expr, (SetExpr, TupleExpr, ListExpr)) and all(isinstance(i, StrExpr) for i in expr.items):
        return frozenset(i.value for i in expr.items if isinstance(i, StrExpr))
    if isinstance(expr, CallExpr) and isinstance(expr.callee, RefExpr) and \
            expr.callee.fullname in ("builtins.frozenset", "builtins.set") and len(expr.args) <= 1:
        return str_set(expr.args[0]) if expr.args else frozenset()
    return None


def _is_none(expr: Expression) -> bool:
    return isinstance(expr, NameExpr) and expr.fullname == "builtins.None"


def read_spec(expr: Expression) -> Specs | None:
    """An out_specs expression: a spec, a list for a tuple of them, None when not static."""
    if isinstance(expr, TupleExpr):
        return [read_spec(i) for i in expr.items]
    if isinstance(expr, NameExpr) and expr.fullname == "builtins.None":
        return Spec(())
    if not (isinstance(expr, CallExpr) and isinstance(expr.callee, RefExpr)
            and expr.callee.fullname in _PARTITION_SPEC):
        return None
    entries: list[Entry] = []
    extra: dict[str, frozenset[str]] = {}
    for kind, name, a in zip(expr.arg_kinds, expr.arg_names, expr.args, strict=True):
        if kind == ARG_POS:
            if isinstance(a, NameExpr) and a.fullname == "builtins.None":
                entries.append(None)
            elif isinstance(a, StrExpr):
                entries.append(a.value)
            elif isinstance(a, TupleExpr) and all(isinstance(i, StrExpr) for i in a.items):
                entries.append(tuple(i.value for i in a.items if isinstance(i, StrExpr)))
            else:
                return None
        elif kind == ARG_NAMED and name in ("unreduced", "reduced"):
            axes = str_set(a)
            if axes is None:
                return None
            extra[name] = axes
        else:
            return None
    return Spec(tuple(entries), extra.get("unreduced", frozenset()), extra.get("reduced", frozenset()))


# ----------------------------------------------------------------------- specs as mypy types


def spec_type(api: Any, spec: Specs | None) -> Type:
    """A spec (tree) as a type: `StaticSpec[tuple[entries], U, R]`, a tuple for a tuple."""
    if isinstance(spec, list):
        return tuple_of(api, [spec_type(api, s) for s in spec])
    if spec is None:
        return NoneType()  # not static: no check under it
    s = str_type(api)

    def entry(e: Entry) -> Type:
        if e is None:
            return NoneType()
        if isinstance(e, str):
            return LiteralType(e, s)
        return tuple_of(api, [LiteralType(a, s) for a in e])

    return named(api, STATIC_SPEC, [tuple_of(api, [entry(e) for e in spec.entries]),
                                    axes_type(api, spec.unreduced), axes_type(api, spec.reduced)])


def spec_of(t: Type) -> Specs | None:
    """The inverse of `spec_type` (None: not a spec)."""
    p = get_proper_type(t)
    if isinstance(p, TupleType):
        return [spec_of(i) for i in p.items]
    if not (isinstance(p, Instance) and p.type.fullname == STATIC_SPEC and len(p.args) == 3):
        return None
    part, un, red = (get_proper_type(a) for a in p.args)
    u, r = axes_of(un), axes_of(red)
    if not isinstance(part, TupleType) or u is None or r is None:
        return None
    entries: list[Entry] = []
    for item in (get_proper_type(i) for i in part.items):
        if isinstance(item, NoneType):
            entries.append(None)
        elif isinstance(item, LiteralType) and isinstance(item.value, str):
            entries.append(item.value)
        elif isinstance(item, TupleType):
            names = [get_proper_type(i) for i in item.items]
            entries.append(tuple(str(n.value) for n in names if isinstance(n, LiteralType)))
        else:
            return None
    return Spec(tuple(entries), u, r)


# ---------------------------------------------------------------------------------- checks


def out_spec_error(spec: Specs | None, t: Type, manual: frozenset[str], where: str
                   ) -> SpmdTypeError | None:
    """The first SPMD401 of declared output type `t` under `spec` (a prefix of the output);
    `manual` empty: every axis the value and the spec name."""
    p = get_proper_type(t)
    if isinstance(spec, list):
        if not (isinstance(p, TupleType) and len(p.items) == len(spec)):
            return None  # a structure mismatch (SPMD402) or a pytree the plugin does not read
        for sub, item in zip(spec, p.items, strict=True):
            err = out_spec_error(sub, item, manual, where)
            if err:
                return err
        return None
    if spec is None:
        return None
    if isinstance(p, TupleType):  # one spec for every leaf under it
        for item in p.items:
            err = out_spec_error(spec, item, manual, where)
            if err:
                return err
        return None
    o = to_operand(p)
    if not isinstance(o, SpmdType):
        return None
    part = spec.partitioned
    axes = manual or o.axes | set(part) | spec.unreduced | spec.reduced
    try:
        _rules.check_out_spec(o, part, spec.unreduced, spec.reduced, tuple(sorted(axes)),
                              where=where, spec=spec.text)
    except SpmdTypeError as err:
        return err
    return None


def _where(ft: CallableType) -> str:
    return f"st.shard_map({ft.name or 'f'})"


def _fits_hint(want: SpmdType, have: SpmdType) -> bool:
    # the hints' covariance (`_hints`' isinstance rule): Varying covariant, U and R exact
    return (have.varying <= want.varying and have.unreduced == want.unreduced
            and have.reduced == want.reduced)


def in_spec_error(spec: Specs | None, ft: CallableType, manual: frozenset[str], where: str
                  ) -> SpmdTypeError | None:
    """SPMD403 when an in_spec gives a positional parameter a state its hint rejects (as
    `_shard_map.check_hints` at runtime); specs the plugin cannot read are skipped."""
    if spec is None:
        return None
    params = [(n or f"argument {i}", t) for i, (n, t, k) in
              enumerate(zip(ft.arg_names, ft.arg_types, ft.arg_kinds, strict=True))
              if k == ARG_POS or k.is_optional() and not k.is_named() and not k.is_star()]
    specs: list[Specs | None] = spec if isinstance(spec, list) else [spec] * len(params)
    for (pname, t), sp in zip(params, specs, strict=False):
        want = to_operand(t)
        if not isinstance(want, SpmdType) or not isinstance(sp, Spec):
            continue
        have = _rules.in_spec_type(sp.partitioned, sp.unreduced, sp.reduced,
                                   manual or None)
        if _fits_hint(want, have):
            continue
        bad = sorted(a for a in have.axes | want.axes if have.state(a) is not want.state(a))
        return error("SPMD403", f"{where}: in_specs entry {sp.text} gives parameter {pname!r} "
                     f"the state {have}, but its hint is {want}", op="st.shard_map",
                     axes=tuple(bad), states=have.states(bad),
                     fix=f"make the spec and the hint agree: the hint {have} for {sp.text}, or "
                         f"the spec that gives {want}")
    return None


def decorator_arg(node: Any, name: str) -> Expression | None:
    """Argument `name` of the `@st.shard_map(...)` decorating `node` (a Decorator), else None."""
    if not isinstance(node, Decorator):
        return None
    for d in node.decorators:
        if isinstance(d, CallExpr) and isinstance(d.callee, RefExpr) and d.callee.fullname in FUNCTIONS:
            for n, a in zip(d.arg_names, d.args, strict=True):
                if n == name:
                    return a
    return None


def param_in_spec(node: Any, index: int) -> tuple[Spec, frozenset[str] | None] | None:
    """The literal in_spec of positional parameter `index` of the function `node` decorates
    with `@st.shard_map(in_specs=...)`, and the manual axes (None: every mesh axis); None when
    there is none or it is not literal."""
    expr = decorator_arg(node, "in_specs")
    if expr is None:
        return None
    manual: frozenset[str] | None = None
    names = decorator_arg(node, "axis_names")
    if names is not None:
        manual = str_set(names)
        if manual is None:
            return None
    spec = read_spec(expr)
    if isinstance(spec, list):
        spec = spec[index] if index < len(spec) else None
    return (spec, manual or None) if isinstance(spec, Spec) else None


def _report_in_specs(api: Any, expr: Expression | None, ft: CallableType, manual: frozenset[str],
                     context: Any) -> None:
    if expr is None:
        return
    err = in_spec_error(read_spec(expr), ft, manual, _where(ft))
    if err is not None:
        report(api, err, context)


def _checked(api: Any, ft: CallableType, specs: Type, manual: Type, default: Type) -> Type:
    """`OutSpecMismatch[specs, ft, manual]` when `ft`'s declared outputs do not fit, else `default`."""
    if out_spec_error(spec_of(specs), ft.ret_type, axes_of(manual) or frozenset(), _where(ft)) is None:
        return default
    return named(api, OUT_SPEC_MISMATCH, [specs, ft, manual])


def _shard_map(ctx: FunctionContext) -> Type:
    """`st.shard_map(f, out_specs=...)`, or the decorator form `st.shard_map(mesh=..., ...)`
    (a `ShardMapDecorator` carrying the specs, checked when it is applied)."""
    default = ctx.default_return_type
    fun = arg(ctx, "f")
    if fun is None and ctx.args and ctx.args[0]:
        fun = ctx.args[0][0], ctx.arg_types[0][0]
    specs = arg(ctx, "out_specs")
    if specs is None or _is_none(specs[0]):  # `out_specs=None`: derived from the hints at runtime
        return default
    manual: frozenset[str] = frozenset()
    names = arg(ctx, "axis_names")
    if names is not None:
        m = str_set(names[0])
        if m is None:
            return default
        manual = m
    spec = read_spec(specs[0])
    if spec is None:
        return default
    s_t, m_t = spec_type(ctx.api, spec), axes_type(ctx.api, manual)
    if fun is None:  # the decorator form
        return named(ctx.api, SHARD_MAP_DECORATOR, [s_t, m_t])
    ft = get_proper_type(fun[1])
    if not isinstance(ft, CallableType):
        return default
    in_specs = arg(ctx, "in_specs")
    _report_in_specs(ctx.api, in_specs[0] if in_specs else None, ft, manual, ctx.context)
    return _checked(ctx.api, ft, s_t, m_t, default)


def _decorate(ctx: MethodContext) -> Type:
    """`@st.shard_map(mesh=..., out_specs=P(...))` applied to a function."""
    p = get_proper_type(ctx.type)
    ft = get_proper_type(ctx.arg_types[0][0]) if ctx.arg_types and ctx.arg_types[0] else None
    if not (isinstance(p, Instance) and len(p.args) == 2 and isinstance(ft, CallableType)):
        return ctx.default_return_type
    _report_in_specs(ctx.api, decorator_arg(ctx.context, "in_specs"), ft,
                     axes_of(p.args[1]) or frozenset(), ctx.context)
    return _checked(ctx.api, ft, p.args[0], p.args[1], ctx.default_return_type)


def _call(ctx: MethodContext) -> Type:
    """A call of an `OutSpecMismatch`: report the SPMD401 its type arguments give."""
    p = get_proper_type(ctx.type)
    if isinstance(p, Instance) and len(p.args) == 3:
        ft = get_proper_type(p.args[1])
        if isinstance(ft, CallableType):
            err = out_spec_error(spec_of(p.args[0]), ft.ret_type, axes_of(p.args[2]) or frozenset(),
                                 _where(ft))
            if err is not None:
                report(ctx.api, err, ctx.context)
    return any_type()
