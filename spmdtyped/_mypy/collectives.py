"""Collectives and casts: `st.psum` ... `st.pcast`, `st.axis_index`: every row of the
collective table (`_surface.collectives`, looked up at hook time: `name_of`), the operand's
state through `_rules.axis_op` (leaf by leaf of a tuple pytree)."""

from __future__ import annotations

from typing import Final

from mypy.nodes import Expression, NameExpr
from mypy.plugin import FunctionContext
from mypy.types import AnyType, Instance, TupleType, Type, get_proper_type

from .. import _rules, _surface
from .._errors import SpmdTypeError
from .._rules import LITERAL, SpmdType
from .._rules.refine import Refinement
from .._rules.refine import shape as refine_shape
from . import meshes, refined
from .codes import AXIS, report
from .config import CONFIG
from .convert import (
    SARRAY,
    STATIC,
    any_type,
    arg,
    axes_type,
    axis_value,
    from_spmd,
    literal_value,
    named,
    state_of_args,
    to_operand,
)

#: the modules whose collectives are `st.<name>` (the static view, the package, the runtime)
_MODULES: Final = (STATIC, "spmdtyped", "spmdtyped._ops.collectives")
#: `st.axis_size`: an int that remembers its literal axes (`axis_size`)
AXIS_SIZE: Final = frozenset(f"{m}.axis_size" for m in _MODULES)


def name_of(fullname: str) -> str | None:
    """The collective a full name calls (`spmdtyped._static.psum` -> "psum"), read from the
    collective table at hook time (a row registered by a test counts), or None. Only those with
    a typed result: `st.axis_size` is a Python int (`axis_size`)."""
    module, _, name = fullname.rpartition(".")
    if module not in _MODULES:
        return None
    c = _surface.collective(name)
    return name if c is not None and (c.ops or name == "axis_index") else None


def lax_name_of(fullname: str) -> str | None:
    """`spmdtyped.lax.<name>`: jax.lax's drop-ins return raw values, but check typed operands
    as st.<name> does."""
    module, _, name = fullname.rpartition(".")
    if module != "spmdtyped.lax":
        return None
    c = _surface.collective(name)
    return name if c is not None and c.in_lax and (c.ops or name == "axis_index") else None


def analyze(ctx: FunctionContext, name: str, raw: bool = False, label: str | None = None) -> Type:
    """`st.<name>(x, axis_name, ...)`: the result state, or the rule's error. `raw`:
    `spmdtyped.lax.<name>`, whose result is the declared (raw) type; errors are the same.
    `label`: the form's name in messages (`jax.lax.psum`; default `st.<name>`)."""
    if raw:
        # `spmdtyped.lax.psum(1, "tp")` (the axis-size idiom on a Python number) is forwarded
        # to jax.lax unchecked at runtime: no claim here either
        x = arg(ctx, "x")
        if x is not None and to_operand(get_proper_type(x[1])) is LITERAL:
            return ctx.default_return_type
        analyze(ctx, name)
        return ctx.default_return_type
    op = label or f"st.{name}"
    default = ctx.default_return_type
    axis = arg(ctx, "axis_name")
    if axis is None:
        return default
    value = axis_value(*axis)
    if value is None or (isinstance(value, tuple) and None in value):
        # only when enabled: a reported error makes mypy try the next overload
        if AXIS in getattr(ctx.api.options, "enabled_error_codes", ()):
            ctx.api.fail(f"{op}: axis_name is not a literal str or tuple of str; the result "
                         f"state is unknown", ctx.context, code=AXIS)
        return default
    try:
        axes = _rules.normalize_axes(value, op)
        unknown = meshes.unknown_axis(ctx.api, axes, op)
        if unknown is not None:
            raise unknown
        if name == "axis_index":
            return refined.encode(ctx.api, _rules.axis_index_type(axes), refine_shape.axis_index(axes), 0)
        collective = _surface.collective(name)
        assert collective is not None, name
        to = arg(ctx, "to") if collective.select else None
        to_param = collective.param("to")
        to_value = (literal_value(to[1]) if to is not None else
                    to_param.default if to_param is not None else None)
        if collective.select is not None and (to_value is None or to_value is _surface.REQUIRED):
            return default
        rule = collective.op(to_value, op)
    except SpmdTypeError as err:
        report(ctx.api, err, ctx.context)
        return default
    x = arg(ctx, "x")
    if x is None:
        return default
    return _result(ctx, rule, op, axes, x[0], x[1], default, name)


def axis_size(ctx: FunctionContext) -> Type:
    """`st.axis_size(axes)`: `AxisSize[A]` (an int) with `A` the literal axes (`b / n` of a
    replicated `b` is then its share of a partial sum over them: `refined.scale`); the declared
    `int` when they are not literal."""
    axis = arg(ctx, "axis_name")
    names = axis_value(*axis) if axis is not None else None
    if names is None or (isinstance(names, tuple) and None in names):
        return ctx.default_return_type
    try:
        axes = _rules.normalize_axes(names, "st.axis_size")
    except SpmdTypeError:
        return ctx.default_return_type
    return named(ctx.api, refined.AXIS_SIZE, [axes_type(ctx.api, frozenset(axes))])


def _result(ctx: FunctionContext, rule: str, op: str, axes: tuple[str, ...],
            expr: Expression | None, t: Type, default: Type, name: str) -> Type:
    p = get_proper_type(t)
    if isinstance(p, TupleType):  # a pytree: each leaf separately
        return p.copy_modified(items=[_result(ctx, rule, op, axes, None, i, any_type(), name)
                                      for i in p.items])
    if not _rules.AXIS_OPS[rule].from_plain and isinstance(p, Instance) and p.type.fullname == SARRAY \
            and (len(p.args) == 3 or isinstance(p.args[3], AnyType)):
        state = state_of_args(p.args)
        if state is not None:  # no refinement: the four-state rule alone (`rapply`'s)
            try:
                out = _rules.axis_op(rule, state, axes, CONFIG.features, op=op)
            except SpmdTypeError as err:
                report(ctx.api, err, ctx.context)
                return default
            return from_spmd(ctx.api, out)
    alts = refined.ralternatives(ctx.api, t, expr)
    if alts is None:
        return default
    params = _params(ctx, _surface.collective(name))

    def rule_fn(x: SpmdType) -> SpmdType:
        return _rules.axis_op(rule, x, axes, CONFIG.features, op=op)

    def refine(out: SpmdType, v: refined.Val) -> tuple[Refinement, int | None]:
        key = (rule, op, axes, tuple(params.items()), out, v)
        memo = _REFINED.get(key)
        if memo is None:
            if len(_REFINED) > 4096:
                _REFINED.clear()
            memo = _REFINED[key] = _refine(out, v)
        return memo

    def _refine(out: SpmdType, v: refined.Val) -> tuple[Refinement, int | None]:
        depth = max(refined.shard_depth([v]), *(-int(d) for d in params.values()
                                                 if isinstance(d, int) and d < 0), 1)
        ndim = v.rank if v.rank is not None else depth
        # statically a declared Shard is taken to have a local size > 1 (shapes are unknown)
        shape = (2,) * ndim if v.rank is not None or rule in ("psum", "pmean") else None
        ref = refine_shape.collective(rule, v.state, v.ref, out, axes,
                                 shape=shape, op=op, params=params, strict_shards=True)
        grows = rule.startswith("all_gather") and not params.get("tiled", False)
        return ref, (v.rank + 1 if grows and v.rank is not None else v.rank)

    # pvary / pcast(to="varying") make Rep, psum_scatter / all_to_all make Shard from a plain value
    refine.from_plain = _rules.AXIS_OPS[rule].from_plain  # type: ignore[attr-defined]
    return refined.rapply(ctx.api, ctx.context, default, [refined.arrays(alts)], rule_fn, refine)


#: the refinement of a collective's result, by its arguments (a pure function of them; a rule
#: error is raised again, not memoised)
_REFINED: Final[dict[tuple[object, ...], tuple[Refinement, int | None]]] = {}



def _params(ctx: FunctionContext, collective: _surface.Collective | None) -> dict[str, object]:
    """The literal arguments the refinement reads (the row's `Param.refine`: `axis`, `tiled`,
    `scatter_dimension`, `split_axis`, `concat_axis`): ints, and bools for `bool` ones."""
    out: dict[str, object] = {}
    for p in collective.params if collective is not None else ():
        if not p.refine:
            continue
        a = arg(ctx, p.name)
        if a is None:
            continue
        if p.annotation == "bool":
            v = literal_value(a[1])
            if isinstance(v, bool):
                out[p.name] = v
            elif isinstance(a[0], NameExpr) and a[0].fullname in ("builtins.True", "builtins.False"):
                out[p.name] = a[0].fullname == "builtins.True"
        else:
            v = refined.int_value(a[0], a[1])
            if v is not None:
                out[p.name] = v
    return out
