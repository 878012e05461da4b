"""The spmdtyped mypy plugin: precise manual-axis states for every hint, collective and operator.

Enable it with `plugins = spmdtyped.mypy_plugin` in the mypy configuration.

How it works (see `shared/reference/mypy_plugin_study.md` and `docs/static.md`):

- **Hints.** `Varying["dp"]`, `Varying["dp", "tp"]`, `Varying["dp | tp"]`, `Reduced["tp"]`,
  `Unreduced["tp"]`, `Typed[Varying["dp"], Reduced["tp"]]` become the standard type
  `SArray[V, U, R]` (each argument a union of str Literals, `Never` for the empty set). Bare
  strings need no declaration; when the module has an axis vocabulary
  (`dp: TypeAlias = Literal["dp"]`), an undeclared axis stays a `name-defined` error. Hints are
  validated by the runtime's own `_hints._subscript`.
- **Results.** Every collective, cast, operator, array method, `st.numpy` / `st.nn` function
  (named in `_rules.NUMPY_FUNCTIONS` / `NN_FUNCTIONS`, bound as `NUMPY_BINDINGS` says),
  `st.grad`/`st.value_and_grad`/`st.vjp` and control flow (`st.fori_loop`, `while_loop`,
  `scan`, `cond`, `switch`) converts its operands to `_rules.SpmdType`, calls the rule table
  (`_rules.axis_op`, `combine`, `binary`, `unary`, `constructor_type`, `normalize_axes`,
  `cotangent`, `grad_loss_type`, `join_carry`, `predicate_type`, `check_out_spec`) with
  `_rules.CONSERVATIVE` features (or one JAX version's, configured with `[spmdtyped] jax =
  0.12`) and converts the result back. No rule is encoded here.
- **Boundary.** `st.shard_map(f, out_specs=P(...))` checks `f`'s declared outputs against the
  literal specs; a mismatch (SPMD401) is reported where the result is called, as at runtime.
- **Errors.** A `SpmdTypeError` is reported with its runtime headline under the error code
  `spmd-<slug>` of its SPMD code (a sub-code of `spmd`), followed by a note with the fix.
- **Unknown states.** Raw `jax.Array` values, `Any`, non-literal axis names: no error, the
  result is `SArray[Any, Any, Any]` (the opt-in code `spmd-axis` reports non-literal axes).

The plugin imports no JAX (only `spmdtyped._rules`, `_errors` and `_hints`), uses only
standard mypy types (so the incremental cache and dmypy work), and reports a hash of the rule
table as its configuration data so that cached results are invalidated when the rules change.
"""

from __future__ import annotations

import ast
import configparser
import hashlib
import itertools
import json
import os
import re
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from mypy import errorcodes
from mypy.errorcodes import ErrorCode
from mypy.nodes import (
    ARG_NAMED,
    ARG_POS,
    CallExpr,
    Context,
    Expression,
    FloatExpr,
    IntExpr,
    LambdaExpr,
    ListExpr,
    MemberExpr,
    NameExpr,
    RefExpr,
    SetExpr,
    StrExpr,
    TupleExpr,
    TypeAlias,
    TypeInfo,
)
from mypy.options import Options
from mypy.plugin import (
    AnalyzeTypeContext,
    AttributeContext,
    FunctionContext,
    FunctionSigContext,
    MethodContext,
    Plugin,
    ReportConfigContext,
)
from mypy.subtypes import is_same_type
from mypy.typeops import make_simplified_union
from mypy.types import (
    AnyType,
    CallableType,
    FunctionLike,
    Instance,
    LiteralType,
    ProperType,
    RawExpressionType,
    TupleType,
    Type,
    TypeOfAny,
    TypeVarType,
    UnboundType,
    UninhabitedType,
    UnionType,
    get_proper_type,
)

from . import _hints, _rules
from ._errors import REGISTRY, SpmdTypeError, error
from ._rules import LITERAL, SpmdType

# ---------------------------------------------------------------------------------------------
# Error codes: one per registry entry, all sub-codes of `spmd`

SPMD: Final = ErrorCode("spmd", "spmdtyped: manual-axis state errors", "spmdtyped")
CODES: Final = {
    code: ErrorCode(entry.mypy_code, entry.title, "spmdtyped", sub_code_of=SPMD)
    for code, entry in REGISTRY.items()
}
#: opt-in (`enable_error_code = spmd-axis`): an axis name the plugin cannot read statically
AXIS: Final = ErrorCode("spmd-axis", "axis name is not a literal: result state unknown", "spmdtyped",
                        default_enabled=False, sub_code_of=SPMD)

#: the JAX rule set the checks assume: `_rules.CONSERVATIVE` (what every supported JAX allows)
#: unless the configuration says otherwise (`[spmdtyped] jax = 0.12`, see `SpmdPlugin`)
FEATURE_SETS: Final = {"conservative": _rules.CONSERVATIVE, "0.10": _rules.JAX_0_10,
                       "0.12": _rules.JAX_0_12}


class _Config:
    features: _rules.Features = _rules.CONSERVATIVE
    jax: str = "conservative"


CONFIG = _Config()

# ---------------------------------------------------------------------------------------------
# Names (hooks are keyed by the definition site; the static view lives in spmdtyped._static)

_STATIC = "spmdtyped._static"
SARRAY: Final = f"{_STATIC}.SArray"
_FAMILIES = ("Varying", "Unreduced", "Reduced", "Typed")
_HINTS: Final = {f"{m}.{f}": f for m in (_STATIC, "spmdtyped") for f in _FAMILIES}

_COLLECTIVES = ("psum", "pmean", "pmax", "pmin", "ppermute", "pshuffle", "pbroadcast", "all_gather",
                "psum_scatter", "all_to_all", "pvary", "pcast", "axis_index")
_FUNCTIONS: Final = {f"{m}.{n}": n for m in (_STATIC, "spmdtyped", "spmdtyped._collectives")
                     for n in _COLLECTIVES}
_AUTODIFF: Final = {f"{m}.{n}": n for m in ("spmdtyped", "spmdtyped._autodiff")
                    for n in ("grad", "value_and_grad")}

# operator method -> (rule name, reflected, the runtime's op label)
_BINARY: Final = {
    **{f"__{m}__": (rule, False, f"operator {sym}") for m, rule, sym in (
        ("add", "add", "+"), ("sub", "sub", "-"), ("mul", "mul", "*"), ("truediv", "div", "/"),
        ("matmul", "matmul", "@"), ("pow", "pow", "**"), ("lt", "lt", "<"), ("le", "le", "<="),
        ("gt", "gt", ">"), ("ge", "ge", ">="))},
    **{f"__r{m}__": (rule, True, f"operator {sym}") for m, rule, sym in (
        ("add", "add", "+"), ("sub", "sub", "-"), ("mul", "mul", "*"), ("truediv", "div", "/"),
        ("matmul", "matmul", "@"), ("pow", "pow", "**"))},
}
# array method / property -> (rule name, the runtime's op label)
_UNARY: Final = {
    "__neg__": ("neg", "neg"), "__abs__": ("abs", "abs"), "reshape": ("reshape", ".reshape()"),
    "transpose": ("transpose", ".transpose()"), "astype": ("astype", ".astype()"),
    "squeeze": ("squeeze", ".squeeze()"), "ravel": ("ravel", ".ravel()"),
    "sum": ("sum", ".sum()"), "max": ("max", ".max()"), "min": ("min", ".min()"),
    "mean": ("mean", ".mean()"),
}
_PROPERTIES: Final = {"T": ("transpose", ".T"), "mT": ("transpose", ".mT")}
_SCALARS: Final = ("builtins.int", "builtins.float", "builtins.bool", "builtins.complex")


def _rules_digest() -> str:
    """A digest of everything a cached result depends on besides the checked code.

    mypy records one plugin snapshot per cache directory, so a module cached by an older
    plugin can survive a run that rechecked only other modules; this digest is stored in each
    module's cache entry instead (`report_config_data`), and includes the plugin itself.
    """
    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("mypy_plugin.py", "_rules.py", "_errors.py", "_hints.py", "_static.py"):
        try:
            h.update((here / name).read_bytes())
        except OSError:
            pass
    return h.hexdigest()[:16]


_DIGEST: Final = _rules_digest()

# ---------------------------------------------------------------------------------------------
# Conversions between mypy types and _rules.SpmdType


class _Unknown:
    """An operand whose state cannot be known statically (raw jax.Array, Any, a join)."""


UNKNOWN: Final = _Unknown()
#: a known operand state: an SpmdType or LITERAL (`_rules.Operand`)
Known = _rules.Operand


def _axes_of(t: Type) -> frozenset[str] | None:
    """The axis set one SArray argument stands for (None: not a set of str Literals)."""
    p = get_proper_type(t)
    if isinstance(p, UninhabitedType):
        return frozenset()
    if isinstance(p, LiteralType) and isinstance(p.value, str):
        return frozenset((p.value,))
    if isinstance(p, UnionType):
        out: set[str] = set()
        for item in p.items:
            s = _axes_of(item)
            if s is None:
                return None
            out |= s
        return frozenset(out)
    return None


def _is_scalar(p: ProperType) -> bool:
    if isinstance(p, LiteralType):
        return p.fallback.type.fullname in _SCALARS
    return isinstance(p, Instance) and p.type.fullname in _SCALARS


def _is_str(t: Type) -> bool:
    p = get_proper_type(t)
    if isinstance(p, LiteralType):
        return p.fallback.type.fullname == "builtins.str"
    return isinstance(p, Instance) and p.type.fullname == "builtins.str"


def _is_int(p: ProperType) -> bool:
    if isinstance(p, LiteralType):
        return p.fallback.type.fullname in ("builtins.int", "builtins.bool")
    return isinstance(p, Instance) and p.type.fullname in ("builtins.int", "builtins.bool")


def to_operand(t: Type) -> Known | _Unknown:
    """A mypy type as a rule-table operand: an SpmdType, LITERAL (a Python scalar) or UNKNOWN."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY and len(p.args) == 3:
        v, u, r = (_axes_of(a) for a in p.args)
        if v is None or u is None or r is None:
            return UNKNOWN
        try:
            return SpmdType(v, u, r)
        except SpmdTypeError:
            return UNKNOWN
    if _is_scalar(p):
        return LITERAL
    return UNKNOWN


def _named(api: Any, fullname: str, args: list[Type]) -> Instance:
    # The checker's lookup walks `spmdtyped` -> `_static` through package attributes, which a
    # star import does not create: look the class up in the module table instead.
    modules = getattr(api, "modules", None)
    if modules is not None:
        module, _, name = fullname.rpartition(".")
        node = modules[module].names[name].node
        assert isinstance(node, TypeInfo)
        return Instance(node, args)
    return api.named_type(fullname, args)  # type: ignore[no-any-return]


def _axes_type(api: Any, axes: frozenset[str]) -> Type:
    if not axes:
        return UninhabitedType()
    str_type = _named(api, "builtins.str", [])
    return make_simplified_union([LiteralType(a, str_type) for a in sorted(axes)])


def from_spmd(api: Any, t: SpmdType) -> Instance:
    """`SArray[V, U, R]` for an SpmdType (`api`: a checker or type analyser)."""
    return _named(api, SARRAY, [_axes_type(api, t.varying), _axes_type(api, t.unreduced),
                                _axes_type(api, t.reduced)])


def _alternatives(api: Any, t: Type, expr: Expression | None) -> list[Known] | None:
    """The operand states an argument may have: several for a union (e.g. a ternary of
    incompatible states), None when any of them is unknown."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY and expr is not None \
            and isinstance(to_operand(p), _Unknown):
        # A generic call in argument position may have inferred Any from the stub's
        # SArray[Any, Any, Any] parameter: infer the argument again without that context.
        p = get_proper_type(api.get_expression_type(expr, None))
    items = p.items if isinstance(p, UnionType) else [p]
    out: list[Known] = []
    for item in items:
        o = to_operand(item)
        if isinstance(o, _Unknown) or len(out) >= 8:
            return None
        out.append(o)
    return out


# ---------------------------------------------------------------------------------------------
# Reporting


def report(api: Any, err: SpmdTypeError, context: Context) -> None:
    """Report a rule-table error with its runtime headline, code `spmd-<slug>` and the fix."""
    code = CODES.get(err.code, SPMD)
    api.fail(err.headline, context, code=code)
    if err.fix:
        api.msg.note(f"fix: {err.fix}", context, code=code)
    api.msg.note(f"see: python -m spmdtyped explain {err.code}", context, code=code)


def _apply(api: Any, context: Context, default: Type, alternatives: Sequence[list[Known]],
           rule: Callable[..., SpmdType]) -> Type:
    """Call `rule` on every combination of operand states; union the results."""
    results: list[Type] = []
    for combo in itertools.product(*alternatives):
        try:
            out = rule(*combo)
        except SpmdTypeError as err:
            report(api, err, context)
            return default
        results.append(from_spmd(api, out))
    return make_simplified_union(results) if results else default


# ---------------------------------------------------------------------------------------------
# Hints: Varying["dp"] & co.


def _is_axis_alias(node: object) -> bool:
    """An axis vocabulary entry: `dp: TypeAlias = Literal["dp"]` (the alias named as its axis,
    so that the runtime, which reads the string "dp", and the checkers agree)."""
    if not isinstance(node, TypeAlias):
        return False
    target = get_proper_type(node.target)
    return isinstance(target, LiteralType) and target.value == node.name


def _has_vocabulary(api: Any) -> bool:
    """Whether the module declares or imports an axis vocabulary (`dp: TypeAlias = Literal["dp"]`)."""
    try:
        table = api.api.globals
    except AttributeError:
        return False
    return any(_is_axis_alias(sym.node) for sym in table.values())


def _drop_name_defined(api: Any, t: UnboundType) -> None:
    """Remove mypy's spurious `Name "dp" is not defined` for a bare-string axis.

    mypy's semantic analyser looks up every name inside `X[...]` (to find TypeVars) before this
    hook runs and reports string forward references it cannot resolve. Internal API (mypy
    1.15-2.x), hence the try/except: without it the only consequence is a visible spurious error.
    """
    try:
        errors = api.api.errors
        infos = errors.error_info_map.get(errors.file)
        if not infos:
            return
        needle = f'"{t.name}"'
        infos[:] = [i for i in infos if not (i.code is errorcodes.NAME_DEFINED and i.line == t.line
                                             and needle in i.message)]
    except Exception:  # noqa: BLE001 - internal API; never break type checking over it
        pass


class _HintArgs:
    """The analysed arguments of one hint: axis names, nested states, type-level slots."""

    def __init__(self) -> None:
        self.axes: list[str] = []
        self.nested: list[SpmdType] = []
        self.slots: list[tuple[int, Type]] = []  # (slot index, type) for TypeVars / Any


def _bare_string(api: Any, arg: UnboundType, out: _HintArgs, in_string: bool = False) -> bool:
    """A forward-reference-like argument ("dp"): an axis vocabulary alias, or a bare axis."""
    if arg.args or (arg.original_str_expr is None and not in_string) or "." in arg.name:
        return False
    sym = api.lookup_qualified(arg.name, arg, suppress_errors=True)
    if sym is not None and _is_axis_alias(sym.node):
        return False  # analyse it: standard typing resolves the vocabulary alias
    if sym is None and _has_vocabulary(api):
        out.axes.append(arg.name)  # keep mypy's name-defined error: a misspelled axis
        return True
    _drop_name_defined(api, arg)
    out.axes.append(arg.name)
    return True


def _hint_arg(api: Any, arg: Type, out: _HintArgs, family: str, slot: int) -> str | None:
    """Collect one argument; returns an error headline for a non-axis argument."""
    if isinstance(arg, UnboundType) and _bare_string(api, arg, out):
        return None
    if isinstance(arg, RawExpressionType) and isinstance(arg.literal_value, str):
        out.axes.extend(a.strip() for a in arg.literal_value.split("|"))
        return None
    if isinstance(arg, UnionType) and all(isinstance(i, UnboundType) for i in arg.items):
        for item in arg.items:  # "dp | tp"
            assert isinstance(item, UnboundType)
            if not _bare_string(api, item, out, in_string=True):
                err = _hint_arg(api, item, out, family, slot)
                if err:
                    return err
        return None
    analysed = get_proper_type(api.analyze_type(arg))
    if isinstance(analysed, AnyType):
        out.slots.append((slot, analysed))
        return None
    if isinstance(analysed, Instance) and analysed.type.fullname == SARRAY:
        t = to_operand(analysed)
        if isinstance(t, SpmdType):
            out.nested.append(t)
        else:
            out.slots.extend((i, a) for i, a in enumerate(analysed.args)
                             if not isinstance(get_proper_type(a), UninhabitedType))
        return None
    if isinstance(analysed, TypeVarType):
        out.slots.append((slot, analysed))
        return None
    axes = _axes_of(analysed)
    if axes is not None:
        out.axes.extend(sorted(axes))
        return None
    return f"{family}[...]: {analysed} is not an axis name (use a str or Literal[...])"


def analyze_hint(family: str) -> Callable[[AnalyzeTypeContext], Type]:
    return lambda ctx: _analyze_hint(ctx, family)


def _analyze_hint(ctx: AnalyzeTypeContext, family: str) -> Type:
    t, api = ctx.type, ctx.api
    slot = {"Varying": 0, "Unreduced": 1, "Reduced": 2}.get(family, 0)
    if not t.args:
        anys = [AnyType(TypeOfAny.special_form) if family in ("Typed", f) else UninhabitedType()
                for f in ("Varying", "Unreduced", "Reduced")]
        return api.named_type(SARRAY, list[Type](anys))
    out = _HintArgs()
    for arg in t.args:
        problem = _hint_arg(api, arg, out, family, slot)
        if problem:
            err = error("SPMD504", problem)
            api.fail(err.headline, t, code=CODES["SPMD504"])
            return AnyType(TypeOfAny.from_error)
    try:
        params = tuple(out.axes) + tuple(_hints.state_class(n) for n in out.nested)
        if out.slots and not params:
            state = SpmdType()
        else:
            # the runtime's own subscription: same validation, same canonical state
            cls = _hints._subscript(family, params)
            state = _hints.hint_type(cls) or SpmdType()
    except SpmdTypeError as err:
        api.fail(err.headline, t, code=CODES.get(err.code, SPMD))
        return AnyType(TypeOfAny.from_error)
    assert state is not None
    result = from_spmd(api, state)
    if not out.slots:
        return result
    args = list(result.args)
    for i, extra in out.slots:  # TypeVars (generic user code) and Any join the slot's union
        args[i] = extra if isinstance(get_proper_type(args[i]), UninhabitedType) else \
            make_simplified_union([args[i], extra])
    return result.copy_modified(args=args)


# ---------------------------------------------------------------------------------------------
# Collectives and casts


def _literal_value(t: Type) -> object:
    p = get_proper_type(t)
    if isinstance(p, LiteralType):
        return p.value
    if isinstance(p, Instance) and p.last_known_value is not None:
        return p.last_known_value.value
    return None


def _axis_value(expr: Expression, t: Type) -> object:
    """The axis_name argument's value (str, tuple, list or set of str), None if not static."""
    if isinstance(expr, (ListExpr, SetExpr)) and all(isinstance(i, StrExpr) for i in expr.items):
        values = [i.value for i in expr.items if isinstance(i, StrExpr)]
        return values if isinstance(expr, ListExpr) else set(values)
    if isinstance(expr, TupleExpr):
        return tuple(_axis_value(i, AnyType(TypeOfAny.special_form)) for i in expr.items)
    if isinstance(expr, StrExpr):
        return expr.value
    p = get_proper_type(t)
    if isinstance(p, TupleType):
        return tuple(_literal_value(i) for i in p.items)
    return _literal_value(p)


def _arg(ctx: FunctionContext, name: str) -> tuple[Expression, Type] | None:
    try:
        i = ctx.callee_arg_names.index(name)
    except ValueError:
        return None
    if not ctx.args[i]:
        return None
    return ctx.args[i][0], ctx.arg_types[i][0]


def collective_hook(name: str) -> Callable[[FunctionContext], Type]:
    op = f"st.{name}"

    def hook(ctx: FunctionContext) -> Type:
        default = ctx.default_return_type
        axis = _arg(ctx, "axis_name")
        if axis is None:
            return default
        value = _axis_value(*axis)
        if value is None or (isinstance(value, tuple) and None in value):
            # only when enabled: a reported error makes mypy try the next overload
            if AXIS in getattr(ctx.api.options, "enabled_error_codes", ()):
                ctx.api.fail(f"{op}: axis_name is not a literal str or tuple of str; the result "
                             f"state is unknown", ctx.context, code=AXIS)
            return default
        try:
            axes = _rules.normalize_axes(value, op)
            if name == "axis_index":
                return from_spmd(ctx.api, _rules.axis_index_type(axes))
            if name in ("pcast", "all_gather"):
                to = _arg(ctx, "to")
                to_value = "varying" if to is None else _literal_value(to[1])
                if to_value is None:
                    return default
                rule = _rules.pcast_op(to_value, op) if name == "pcast" else _rules.all_gather_op(to_value)
            else:
                rule = name
        except SpmdTypeError as err:
            report(ctx.api, err, ctx.context)
            return default
        x = _arg(ctx, "x")
        if x is None:
            return default
        return _collective_result(ctx, rule, op, axes, x[0], x[1], default)

    return hook


def _collective_result(ctx: FunctionContext, rule: str, op: str, axes: tuple[str, ...],
                       expr: Expression | None, t: Type, default: Type) -> Type:
    p = get_proper_type(t)
    if isinstance(p, TupleType):  # a pytree: each leaf separately
        items = [_collective_result(ctx, rule, op, axes, None, i, AnyType(TypeOfAny.special_form))
                 for i in p.items]
        return p.copy_modified(items=items)
    alts = _alternatives(ctx.api, t, expr)
    if alts is None:
        return default
    alts = [_rules.INVARIANT if o is LITERAL else o for o in alts]  # a scalar is Invariant

    def rule_fn(x: SpmdType) -> SpmdType:
        return _rules.axis_op(rule, x, axes, CONFIG.features, op=op)

    return _apply(ctx.api, ctx.context, default, [alts], rule_fn)


# ---------------------------------------------------------------------------------------------
# Operators and array methods (the dispatch of `_array.binary` / `_array.getattr_`)


def _binary_rule(name: str, op: str) -> Callable[[Known, Known, bool], SpmdType]:
    def rule(a: Known, b: Known, b_is_int: bool) -> SpmdType:
        if name == "pow" and b is LITERAL and b_is_int and isinstance(a, SpmdType):
            return _rules.unary("integer_pow", a, CONFIG.features, op=op)
        if name == "div" and b is LITERAL and isinstance(a, SpmdType) and a.unreduced \
                and not CONFIG.features.unreduced_div:
            # as _array.binary: on jax 0.10 `u / c` is bound as `u * (1/c)`
            return _rules.combine("mul", [a, b], CONFIG.features, op=op).type
        return _rules.combine(name, [a, b], CONFIG.features, op=op).type

    return rule


def binary_hook(method: str) -> Callable[[MethodContext], Type]:
    name, reflected, op = _BINARY[method]
    rule = _binary_rule(name, op)

    def hook(ctx: MethodContext) -> Type:
        default = ctx.default_return_type
        if not ctx.args or not ctx.args[0]:
            return default
        self_alts = _alternatives(ctx.api, ctx.type, None)
        other_t = ctx.arg_types[0][0]
        other_alts = _alternatives(ctx.api, other_t, ctx.args[0][0])
        if self_alts is None or other_alts is None:
            return default
        if reflected:  # `other <op> self`
            def fn(s: Known, o: Known) -> SpmdType:
                return rule(o, s, False)
        else:
            is_int = _is_int(get_proper_type(other_t))

            def fn(s: Known, o: Known) -> SpmdType:
                return rule(s, o, is_int)
        return _apply(ctx.api, ctx.context, default, [self_alts, other_alts], fn)

    return hook


def _unary(ctx: MethodContext | AttributeContext, name: str, op: str) -> Type:
    default = ctx.default_return_type if isinstance(ctx, MethodContext) else ctx.default_attr_type
    alts = _alternatives(ctx.api, ctx.type, None)
    if alts is None:
        return default
    return _apply(ctx.api, ctx.context, default, [alts],
                  lambda t: _rules.unary(name, t, CONFIG.features, op=op))


def unary_hook(method: str) -> Callable[[MethodContext], Type]:
    name, op = _UNARY[method]
    return lambda ctx: _unary(ctx, name, op)


def property_hook(attr: str) -> Callable[[AttributeContext], Type]:
    name, op = _PROPERTIES[attr]
    return lambda ctx: _unary(ctx, name, op)


def getitem_hook(ctx: MethodContext) -> Type:
    """`x[idx]`, as `_array.getitem`: static indices are `getitem`; an array-valued index is a
    dynamic slice, typed by `_rules.dynamic_index_type` with the indices' states."""
    default = ctx.default_return_type
    idx = get_proper_type(ctx.arg_types[0][0]) if ctx.arg_types and ctx.arg_types[0] else None
    items = list(idx.items) if isinstance(idx, TupleType) else [idx] if idx is not None else []
    index_types: list[SpmdType] = []
    dynamic = False
    for item in items:
        p = get_proper_type(item)
        if isinstance(p, AnyType):
            return default  # maybe an array: the rule is unknown
        if isinstance(p, Instance) and p.type.fullname == SARRAY:
            t = to_operand(p)
            if not isinstance(t, SpmdType):
                return default
            index_types.append(t)
            dynamic = True
        elif isinstance(p, Instance) and p.type.fullname == "jax._src.basearray.Array":
            return default  # a raw JAX index: its state is unknown statically
    alts = _alternatives(ctx.api, ctx.type, None)
    if alts is None:
        return default
    if not dynamic:
        return _apply(ctx.api, ctx.context, default, [alts],
                      lambda t: _rules.unary("getitem", t, CONFIG.features, op="indexing"))
    return _apply(ctx.api, ctx.context, default, [alts],
                  lambda t: _rules.dynamic_index_type(t, index_types, CONFIG.features, op="indexing"))


def abs_hook(ctx: FunctionContext) -> Type:
    """`abs(x)` (builtins.abs does not go through the `__abs__` method hook)."""
    if not ctx.arg_types or not ctx.arg_types[0]:
        return ctx.default_return_type
    alts = _alternatives(ctx.api, ctx.arg_types[0][0], ctx.args[0][0])
    if alts is None or LITERAL in alts:
        return ctx.default_return_type
    return _apply(ctx.api, ctx.context, ctx.default_return_type, [alts],
                  lambda t: _rules.unary("abs", t, CONFIG.features, op="abs"))


# `st.numpy` and `st.nn`: each function's rule and binding come from `_rules.NUMPY_FUNCTIONS` /
# `NUMPY_BINDINGS` and `NN_FUNCTIONS` / `NN_BINDINGS`, the tables spmdtyped/numpy.py and nn.py
# are built from (see `_rules.FUNCTION_BINDINGS` for what each binding means).
_ARRAY_LIKE_STATIC: Final = frozenset({"builtins.list", "builtins.tuple", "builtins.int",
                                       "builtins.bool", "builtins.slice"})


def _positional(ctx: FunctionContext) -> list[tuple[Expression, Type]]:
    out = []
    for kinds, exprs, types in zip(ctx.arg_kinds, ctx.args, ctx.arg_types, strict=True):
        for kind, expr, t in zip(kinds, exprs, types, strict=True):
            if kind.is_positional():
                out.append((expr, t))
    return out


def _keyword(ctx: FunctionContext, name: str) -> tuple[Expression, Type] | None:
    for names, exprs, types in zip(ctx.arg_names, ctx.args, ctx.arg_types, strict=True):
        for n, expr, t in zip(names, exprs, types, strict=True):
            if n == name:
                return expr, t
    return None


def _fill_alternatives(ctx: FunctionContext, fill: tuple[Expression, Type] | None
                       ) -> list[Known] | None:
    """A constructor's fill value (None: unknown): a scalar or a typed value."""
    if fill is None:
        return [LITERAL]
    return _alternatives(ctx.api, fill[1], fill[0])


def function_hook(module: str, name: str, rule: str, binding: str) -> Callable[[FunctionContext], Type]:
    """`st.<module>.<name>(...)`: the table's rule, bound as the runtime binds it."""
    op = f"st.{module}.{name}"

    def constructor(ctx: FunctionContext, args: list[tuple[Expression, Type]]) -> Type:
        default = ctx.default_return_type
        if binding == "like":
            if not args:
                return default
            like = _alternatives(ctx.api, args[0][1], args[0][0])
            if like is None:
                return default
            likes = [_rules.INVARIANT if o is LITERAL else o for o in like]
            bases: list[SpmdType] = [_rules.constructor_type(rule, t) for t in likes]  # type: ignore[arg-type]
        else:
            bases = [_rules.constructor_type(rule)]
        fill_at = 1  # full(shape, fill_value) / full_like(a, fill_value)
        if rule not in ("full", "full_like"):
            return make_simplified_union([from_spmd(ctx.api, t) for t in bases])
        fill = args[fill_at] if len(args) > fill_at else _keyword(ctx, "fill_value")
        fills = _fill_alternatives(ctx, fill)
        if fills is None:
            return default

        def fn(base: SpmdType, f: Known) -> SpmdType:
            if f is LITERAL:
                return base
            return _rules.combine("add", [base, f], CONFIG.features, op=op).type

        return _apply(ctx.api, ctx.context, default, [list[Known](bases), fills], fn)

    def hook(ctx: FunctionContext) -> Type:
        default = ctx.default_return_type
        args = _positional(ctx)
        if binding in ("like", "new"):
            return constructor(ctx, args)
        if not args:
            return default
        if binding == "join":
            seq = args[0][0]
            if not isinstance(seq, (ListExpr, TupleExpr)):
                return default
            operands = [(item, ctx.api.get_expression_type(item, None)) for item in seq.items]
        elif binding in ("nary", "einsum"):
            operands = [(e, t) for e, t in args if not _is_str(t)]  # einsum's subscripts
        elif binding == "binary":
            if len(args) < 2:
                return default
            operands = args[:2]
        elif binding == "take":
            index = args[1] if len(args) > 1 else _keyword(ctx, "indices")
            if index is None:
                return default
            it = get_proper_type(index[1])
            io = to_operand(it)
            if isinstance(io, SpmdType) and io.axes:
                operands = [args[0], index]  # a traced index with a state: both operands
            elif io is LITERAL or isinstance(io, SpmdType) or isinstance(it, TupleType) or (
                    isinstance(it, Instance) and it.type.fullname in _ARRAY_LIKE_STATIC):
                operands = args[:1]  # a static (or Invariant) index: unary on the array
            else:
                return default  # a raw JAX index: its state is unknown statically
        else:
            operands = args[:1]
        alts: list[list[Known]] = []
        for expr, t in operands:
            a = _alternatives(ctx.api, t, expr)
            if a is None:
                return default
            alts.append(a)
        if not alts or all(a == [LITERAL] for a in alts):
            return default
        if len(alts) == 1 and binding not in ("join", "nary", "einsum"):
            alts = [[_rules.INVARIANT if o is LITERAL else o for o in alts[0]]]
            return _apply(ctx.api, ctx.context, default, alts,
                          lambda t: _rules.unary(rule, t, CONFIG.features, op=op))
        if binding == "binary" and len(alts) == 2:
            is_int = _is_int(get_proper_type(operands[1][1]))
            return _apply(ctx.api, ctx.context, default, alts,
                          lambda a, b: _rules.binary(rule, a, b, CONFIG.features, op=op,
                                                     int_literal=is_int).type)
        return _apply(ctx.api, ctx.context, default, alts,
                      lambda *ts: _rules.combine(rule, list(ts), CONFIG.features, op=op).type)

    return hook


#: `st.numpy` / `st.nn` function fullname -> (module label, name, rule, binding)
_TABLE_FUNCTIONS: Final = {
    **{f"spmdtyped.numpy.{n}": ("numpy", n, r, _rules.NUMPY_BINDINGS[n])
       for n, r in _rules.NUMPY_FUNCTIONS.items()},
    **{f"spmdtyped.nn.{n}": ("nn", n, r, _rules.NN_BINDINGS[n])
       for n, r in _rules.NN_FUNCTIONS.items()},
}


# ---------------------------------------------------------------------------------------------
# shard_map: declared outputs against out_specs (SPMD401, reported where the function is called)

OUT_SPEC_MISMATCH: Final = f"{_STATIC}.OutSpecMismatch"
SHARD_MAP_DECORATOR: Final = f"{_STATIC}.ShardMapDecorator"
_SHARD_MAP: Final = frozenset({f"{m}.shard_map" for m in (_STATIC, "spmdtyped", "spmdtyped._shard_map")})
_PARTITION_SPEC: Final = frozenset({"jax.sharding.PartitionSpec", "jax._src.partition_spec.PartitionSpec"})

#: a PartitionSpec read from source: (partitioned axes, unreduced, reduced, its repr)
_Spec = tuple[tuple[str, ...], frozenset[str], frozenset[str], str]


def _str_set(expr: Expression) -> frozenset[str] | None:
    if isinstance(expr, StrExpr):
        return frozenset((expr.value,))
    if isinstance(expr, (SetExpr, TupleExpr, ListExpr)) and all(isinstance(i, StrExpr) for i in expr.items):
        return frozenset(i.value for i in expr.items if isinstance(i, StrExpr))
    if isinstance(expr, CallExpr) and isinstance(expr.callee, RefExpr) and \
            expr.callee.fullname in ("builtins.frozenset", "builtins.set") and len(expr.args) == 1:
        return _str_set(expr.args[0])
    return None


def _read_spec(expr: Expression) -> _Spec | list[object] | None:
    """An out_specs expression: a spec, a list for a tuple of them, None when not static."""
    if isinstance(expr, TupleExpr):
        return [_read_spec(i) for i in expr.items]
    if isinstance(expr, NameExpr) and expr.fullname == "builtins.None":
        return ((), frozenset(), frozenset(), "P()")
    if not (isinstance(expr, CallExpr) and isinstance(expr.callee, RefExpr)
            and expr.callee.fullname in _PARTITION_SPEC):
        return None
    part: list[str] = []
    shown: list[str] = []
    extra: dict[str, frozenset[str]] = {}
    for kind, name, arg in zip(expr.arg_kinds, expr.arg_names, expr.args, strict=True):
        if kind == ARG_POS:
            if isinstance(arg, NameExpr) and arg.fullname == "builtins.None":
                shown.append("None")
            elif isinstance(arg, StrExpr):
                part.append(arg.value)
                shown.append(repr(arg.value))
            elif isinstance(arg, TupleExpr) and all(isinstance(i, StrExpr) for i in arg.items):
                names = tuple(i.value for i in arg.items if isinstance(i, StrExpr))
                part.extend(names)
                shown.append(repr(names))
            else:
                return None
        elif kind == ARG_NAMED and name in ("unreduced", "reduced"):
            axes = _str_set(arg)
            if axes is None:
                return None
            extra[name] = axes
        else:
            return None
    text = ", ".join(shown) + ("," if len(shown) == 1 and not extra else "")
    text += "".join(f"{', ' if text else ''}{k}={set(sorted(v))!r}" for k, v in extra.items())
    return (tuple(part), extra.get("unreduced", frozenset()), extra.get("reduced", frozenset()),
            f"P({text})")


def _out_spec_errors(spec: object, t: Type, manual: frozenset[str] | None, where: str
                     ) -> SpmdTypeError | None:
    """The first SPMD401 of declared output type `t` under `spec` (a prefix of the output)."""
    p = get_proper_type(t)
    if isinstance(spec, list):
        if not (isinstance(p, TupleType) and len(p.items) == len(spec)):
            return None  # a structure mismatch (SPMD402) or a pytree the plugin does not read
        for sub, item in zip(spec, p.items, strict=True):
            err = _out_spec_errors(sub, item, manual, where)
            if err:
                return err
        return None
    if not isinstance(spec, tuple):
        return None
    if isinstance(p, TupleType):  # one spec for every leaf under it
        for item in p.items:
            err = _out_spec_errors(spec, item, manual, where)
            if err:
                return err
        return None
    o = to_operand(p)
    if not isinstance(o, SpmdType):
        return None
    part, un, red, text = spec
    axes = manual if manual is not None else o.axes | set(part) | un | red
    try:
        _rules.check_out_spec(o, part, un, red, tuple(sorted(axes)), where=where, spec=text)
    except SpmdTypeError as err:
        return err
    return None


def _spec_to_json(spec: object) -> object:
    if isinstance(spec, list):
        return [_spec_to_json(s) for s in spec]
    if isinstance(spec, tuple):
        part, un, red, text = spec
        return {"p": list(part), "u": sorted(un), "r": sorted(red), "s": text}
    return None


def _spec_from_json(obj: object) -> object:
    if isinstance(obj, list):
        return [_spec_from_json(o) for o in obj]
    if isinstance(obj, dict):
        return (tuple(obj["p"]), frozenset(obj["u"]), frozenset(obj["r"]), obj["s"])
    return None


def _mismatch(api: Any, ft: CallableType, spec: object, manual: frozenset[str] | None,
              default: Type) -> Type:
    """`OutSpecMismatch` carrying the first SPMD401 of `ft`'s declared outputs, or `default`."""
    err = _out_spec_errors(spec, ft.ret_type, manual or None, f"st.shard_map({ft.name or 'f'})")
    if err is None:
        return default
    payload = "\n".join((err.code, err.headline, err.fix or ""))
    return _named(api, OUT_SPEC_MISMATCH, [LiteralType(payload, _named(api, "builtins.str", []))])


def shard_map_hook(ctx: FunctionContext) -> Type:
    """`st.shard_map(f, out_specs=...)`: when `f`'s declared return type does not fit the
    out_specs read from source (`P(...)` literals), the result is an `OutSpecMismatch` whose call
    is reported (SPMD401), as the runtime raises it when the function is called. The decorator
    form returns a `ShardMapDecorator` carrying the specs, checked when it is applied."""
    default = ctx.default_return_type
    fun = _arg(ctx, "f")
    if fun is None and ctx.args and ctx.args[0]:
        fun = ctx.args[0][0], ctx.arg_types[0][0]
    specs = _arg(ctx, "out_specs")
    if specs is None:
        return default
    manual: frozenset[str] | None = None
    names = _arg(ctx, "axis_names")
    if names is not None:
        manual = _str_set(names[0])
        if manual is None:
            return default
    spec = _read_spec(specs[0])
    if fun is None:  # the decorator form
        if spec is None:
            return default
        payload = json.dumps({"spec": _spec_to_json(spec), "manual": sorted(manual or ())})
        return _named(ctx.api, SHARD_MAP_DECORATOR,
                      [LiteralType(payload, _named(ctx.api, "builtins.str", []))])
    ft = get_proper_type(fun[1])
    if not isinstance(ft, CallableType):
        return default
    return _mismatch(ctx.api, ft, spec, manual, default)


def decorator_call_hook(ctx: MethodContext) -> Type:
    """`@st.shard_map(mesh=..., out_specs=P(...))` applied to a function (see shard_map_hook)."""
    p = get_proper_type(ctx.type)
    payload = get_proper_type(p.args[0]) if isinstance(p, Instance) and p.args else None
    ft = get_proper_type(ctx.arg_types[0][0]) if ctx.arg_types and ctx.arg_types[0] else None
    if not (isinstance(payload, LiteralType) and isinstance(payload.value, str)
            and isinstance(ft, CallableType)):
        return ctx.default_return_type
    data = json.loads(payload.value)
    return _mismatch(ctx.api, ft, _spec_from_json(data["spec"]), frozenset(data["manual"]),
                     ctx.default_return_type)


def out_spec_call_hook(ctx: MethodContext) -> Type:
    """A call of an `OutSpecMismatch`: report the SPMD401 its type carries."""
    p = get_proper_type(ctx.type)
    if isinstance(p, Instance) and p.args:
        payload = get_proper_type(p.args[0])
        if isinstance(payload, LiteralType) and isinstance(payload.value, str):
            code, headline, fix = (payload.value.split("\n") + ["", ""])[:3]
            err = error(code, headline, fix=fix or None)
            report(ctx.api, err, ctx.context)
    return AnyType(TypeOfAny.special_form)


# ---------------------------------------------------------------------------------------------
# Autodiff: st.grad / st.value_and_grad


def _argnums(expr: Expression | None) -> int | tuple[int, ...] | None:
    if expr is None:
        return 0
    if isinstance(expr, IntExpr):
        return expr.value
    if isinstance(expr, TupleExpr) and all(isinstance(i, IntExpr) for i in expr.items):
        return tuple(i.value for i in expr.items if isinstance(i, IntExpr))
    return None


def _cotangent_of(api: Any, t: Type) -> Type | None:
    """The gradient type of a parameter or argument of type `t` (`_rules.cotangent` on each
    leaf of a tuple/list/dict pytree); None when a leaf's state is unknown."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY:
        o = to_operand(p)
        return from_spmd(api, _rules.cotangent(o)) if isinstance(o, SpmdType) else None
    if isinstance(p, TupleType):
        items = [_cotangent_of(api, i) for i in p.items]
        return None if any(i is None for i in items) else \
            p.copy_modified(items=[i for i in items if i is not None])
    if isinstance(p, Instance) and p.type.fullname in ("builtins.dict", "builtins.list",
                                                       "builtins.tuple") and p.args:
        leaf = _cotangent_of(api, p.args[-1])
        return None if leaf is None else p.copy_modified(args=[*p.args[:-1], leaf])
    return None


def _grad_name(name: str, fun: str | None, nums: int | tuple[int, ...], has_aux: bool) -> str:
    """The name of the function `st.grad(f, ...)` returns, as mypy prints it in messages; it also
    tells `grad_call_hook` how to type a direct call (`st.grad(f)(x)`)."""
    fun = fun if fun and fun.isidentifier() else "fun"
    return (f"st.{name}({fun}" + (f", argnums={nums!r}" if nums != 0 else "")
            + (", has_aux=True" if has_aux else "") + ")")


_GRAD_NAME: Final = re.compile(r"st\.(grad|value_and_grad)\((\w+)(?:, argnums=([\d(), ]+?))?"
                               r"(, has_aux=True)?\)")


def autodiff_hook(name: str) -> Callable[[FunctionContext], Type]:
    """`st.grad(f, argnums)` / `st.value_and_grad(f, argnums)`: a function with `f`'s parameters
    whose gradients have the cotangent state of each differentiated parameter's annotation
    (`_rules.cotangent`, leaf by leaf of a pytree), and whose loss is checked with
    `_rules.grad_loss_type` (SPMD405). A direct call (`st.grad(f)(w, x)`) types the gradients
    from the arguments' own states (`grad_call_hook`), as the runtime does."""
    op = f"st.{name}"

    def hook(ctx: FunctionContext) -> Type:
        default = ctx.default_return_type
        fun = _arg(ctx, "fun")
        nums_arg = _arg(ctx, "argnums")
        aux_arg = _arg(ctx, "has_aux")
        ft = get_proper_type(fun[1]) if fun else None
        nums = _argnums(nums_arg[0] if nums_arg else None)
        has_aux = False if aux_arg is None else _literal_value(aux_arg[1])
        if not isinstance(ft, CallableType) or nums is None or not isinstance(has_aux, bool):
            return default
        any_t = AnyType(TypeOfAny.special_form)
        loss_t: Type = ft.ret_type
        aux_t: Type = any_t
        if has_aux:
            ret = get_proper_type(ft.ret_type)
            if not (isinstance(ret, TupleType) and len(ret.items) == 2):
                return default
            loss_t, aux_t = ret.items
        loss = to_operand(loss_t)
        if isinstance(loss, SpmdType):
            try:
                _rules.grad_loss_type(loss, op=op)
            except SpmdTypeError as err:
                report(ctx.api, err, ctx.context)
                return default
        grads: list[Type] = []
        for k in (nums,) if isinstance(nums, int) else nums:
            if k >= len(ft.arg_types):
                return default
            grads.append(_cotangent_of(ctx.api, ft.arg_types[k]) or any_t)
        tuple_fallback = _named(ctx.api, "builtins.tuple", [any_t])
        grads_t = grads[0] if isinstance(nums, int) else TupleType(grads, tuple_fallback)
        if name == "grad":
            ret_t: Type = TupleType([grads_t, aux_t], tuple_fallback) if has_aux else grads_t
        else:
            value_t = TupleType([loss_t, aux_t], tuple_fallback) if has_aux else loss_t
            ret_t = TupleType([value_t, grads_t], tuple_fallback)
        return ft.copy_modified(ret_type=ret_t, name=_grad_name(name, ft.name, nums, has_aux))

    return hook


def grad_call_hook(ctx: FunctionContext) -> Type:
    """A direct call of the function `st.grad`/`st.value_and_grad` returned (named by
    `_grad_name`): each gradient has the cotangent state of its *argument* where that is known
    (an Invariant value passed for a `Varying` parameter has an Invariant gradient, as at
    runtime), else of its parameter's annotation."""
    default = ctx.default_return_type
    # the callee's type as already inferred (inferring it again would repeat its errors)
    callee = get_proper_type(ctx.api.lookup_type(ctx.context.callee)) \
        if isinstance(ctx.context, CallExpr) and ctx.api.has_type(ctx.context.callee) else None
    m = _GRAD_NAME.fullmatch(callee.name or "") if isinstance(callee, CallableType) else None
    if m is None:
        return default
    name, has_aux = m.group(1), bool(m.group(4))
    nums = ast.literal_eval(m.group(3)) if m.group(3) else 0
    ks = (nums,) if isinstance(nums, int) else tuple(nums)
    ret = get_proper_type(default)
    # where the gradients sit in the result (see autodiff_hook)
    if name == "grad" and not has_aux:
        grads_t, rebuild = ret, (lambda g: g)
    elif isinstance(ret, TupleType) and len(ret.items) == 2:
        if name == "grad":
            grads_t, rebuild = ret.items[0], (lambda g: ret.copy_modified(items=[g, ret.items[1]]))
        else:
            grads_t, rebuild = ret.items[1], (lambda g: ret.copy_modified(items=[ret.items[0], g]))
    else:
        return default
    grads_p = get_proper_type(grads_t)
    old = [grads_t] if isinstance(nums, int) else \
        list(grads_p.items) if isinstance(grads_p, TupleType) and len(grads_p.items) == len(ks) else None
    if old is None:
        return default
    new: list[Type] = []
    for k, before in zip(ks, old, strict=True):
        actual = ctx.arg_types[k][0] if k < len(ctx.arg_types) and len(ctx.arg_types[k]) == 1 else None
        new.append((_cotangent_of(ctx.api, actual) if actual is not None else None) or before)
    if isinstance(nums, int):
        return rebuild(new[0])
    assert isinstance(grads_p, TupleType)
    return rebuild(grads_p.copy_modified(items=new))


# ---------------------------------------------------------------------------------------------
# Control flow (st.fori_loop, while_loop, scan, cond, switch) and st.vjp: result types from the
# declared types of the bodies/branches, joined with `_rules.join_carry` as the runtime joins
# them. Where a body's result is not known (an unannotated body, a lambda over Any), the result
# stays Any: the runtime may widen the carry, and the initial carry's type would be too narrow.

_CONTROL: Final = {f"spmdtyped.{m}{n}": n for m in ("", "_control.")
                   for n in ("fori_loop", "while_loop", "scan", "cond", "switch")}
_VJP: Final = frozenset({"spmdtyped.vjp", "spmdtyped._autodiff.vjp"})


class _Join(Exception):
    """Two carry/output types the plugin cannot join statically (unknown leaves, structures)."""


def _items(t: Type, n: int) -> list[Type] | None:
    """The `n` items of a tuple type (a fixed tuple, or `tuple[X, ...]`)."""
    p = get_proper_type(t)
    if isinstance(p, TupleType):
        return list(p.items) if len(p.items) == n else None
    if isinstance(p, Instance) and p.type.fullname == "builtins.tuple" and len(p.args) == 1:
        return [p.args[0]] * n
    return None


def _join_types(api: Any, a: Type, b: Type, *, op: str, what: str,
                labels: tuple[str, str]) -> Type:
    """The join of two (pytrees of) typed values by free casts (`_rules.join_carry`); raises
    `_Join` when a leaf is unknown, `SpmdTypeError` (SPMD302) when no free cast joins them."""
    pa, pb = get_proper_type(a), get_proper_type(b)
    if isinstance(pa, TupleType):
        items = _items(pb, len(pa.items))
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
    if _is_scalar(p):
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
    b = _arg(ctx, body)
    if b is not None and isinstance(b[0], LambdaExpr) and not is_same_type(init, joined):
        raise _Join
    return joined


def control_hook(name: str) -> Callable[[FunctionContext], Type]:
    op = f"st.{name}"
    body_labels = ("before the body", "after the body")

    def arg_t(ctx: FunctionContext, param: str) -> Type | None:
        a = _arg(ctx, param)
        return a[1] if a else None

    def hook(ctx: FunctionContext) -> Type:
        default = ctx.default_return_type
        api = ctx.api
        try:
            if name == "fori_loop":
                init = arg_t(ctx, "init_val")
                if init is None:
                    return default
                varying = _predicate_varying(arg_t(ctx, "lower")) | _predicate_varying(arg_t(ctx, "upper"))
                carry = _widen(api, init, varying, op=op, what="init_val", kind="trip count")
                return _stable(ctx, "body_fun", carry, _join_types(
                    api, carry, _ret(arg_t(ctx, "body_fun")), op=op, what="init_val",
                    labels=body_labels))
            if name == "while_loop":
                init = arg_t(ctx, "init_val")
                if init is None:
                    return default
                carry = _stable(ctx, "body_fun", init, _join_types(
                    api, init, _ret(arg_t(ctx, "body_fun")), op=op, what="init_val",
                    labels=body_labels))
                varying = _predicate_varying(_ret(arg_t(ctx, "cond_fun")))
                return _widen(api, carry, varying, op=op, what="init_val", kind="condition")
            if name == "scan":
                init = arg_t(ctx, "init")
                if init is None:
                    return default
                out = _items(_ret(arg_t(ctx, "f")), 2)
                if out is None:
                    return default
                carry = _stable(ctx, "f", init, _join_types(api, init, out[0], op=op, what="init",
                                                            labels=body_labels))
                any_t = AnyType(TypeOfAny.special_form)
                return TupleType([carry, out[1]], _named(api, "builtins.tuple", [any_t]))
            # cond / switch: the branches' outputs joined, widened by a varying predicate
            if name == "cond":
                fns: list[Type | None] = [arg_t(ctx, "true_fun"), arg_t(ctx, "false_fun")]
                pred = arg_t(ctx, "pred")
            else:
                branches = _arg(ctx, "branches")
                if branches is None or not isinstance(branches[0], (ListExpr, TupleExpr)):
                    return default
                # as inferred with the signature hook's context (lambdas on typed operands)
                fns = [api.lookup_type(e) if api.has_type(e) else api.get_expression_type(e, None)
                       for e in branches[0].items]
                pred = arg_t(ctx, "index")
            if not fns:
                return default
            out_t = _ret(fns[0])
            for k, fn in enumerate(fns[1:], 1):
                out_t = _join_types(api, out_t, _ret(fn), op=op, what="output",
                                    labels=(f"in branch {', '.join(map(str, range(k)))}",
                                            f"in branch {k}"))
            varying = _predicate_varying(pred)
            return _widen(api, out_t, varying, op=op, what="output", kind="predicate")
        except _Join:
            return default
        except SpmdTypeError as err:
            report(api, err, ctx.context)
            return default

    return hook


def _simple_type(api: Any, expr: Expression | None) -> Type | None:
    """The type of an argument whose inference has no side effects (names, attributes of
    names, literals, tuples of them): safe to infer once more for a signature hook."""
    if isinstance(expr, TupleExpr):
        items = [_simple_type(api, i) for i in expr.items]
        if any(i is None for i in items):
            return None
        any_t = AnyType(TypeOfAny.special_form)
        return TupleType([i for i in items if i is not None], _named(api, "builtins.tuple", [any_t]))
    if isinstance(expr, (NameExpr, IntExpr, FloatExpr)) or (
            isinstance(expr, MemberExpr) and isinstance(expr.expr, NameExpr)):
        return api.get_expression_type(expr, None)  # type: ignore[no-any-return]
    return None


def control_signature_hook(name: str) -> Callable[[FunctionSigContext], FunctionLike]:
    """Give the bodies/branches of `st.<name>` the carry's (operands') types as parameter types,
    so that a lambda body is inferred on typed values (`lambda i, c: c + x`)."""

    def hook(ctx: FunctionSigContext) -> FunctionLike:
        sig = ctx.default_signature
        names = sig.arg_names
        any_t = AnyType(TypeOfAny.special_form)

        def expr(param: str) -> Expression | None:
            i = names.index(param) if param in names else -1
            return ctx.args[i][0] if i >= 0 and len(ctx.args[i]) == 1 else None

        def fn(params: list[Type]) -> CallableType:
            return CallableType(params, [ARG_POS] * len(params), [None] * len(params), any_t,
                                _named(ctx.api, "builtins.function", []))

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
                bodies["branches"] = _named(ctx.api, "typing.Sequence", [branch])
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

    return hook


def vjp_hook(ctx: FunctionContext) -> Type:
    """`st.vjp(fun, *primals)`: `(out, pullback)` (`(out, pullback, aux)` with has_aux), `out`
    of `fun`'s declared result, the pullback returning one cotangent per primal in the primal's
    cotangent state (`_rules.cotangent`; Any where a primal's state is unknown)."""
    default = ctx.default_return_type
    fun = _arg(ctx, "fun")
    aux = _arg(ctx, "has_aux")
    has_aux = False if aux is None else _literal_value(aux[1])
    ft = get_proper_type(fun[1]) if fun else None
    if not isinstance(ft, CallableType) or not isinstance(has_aux, bool):
        return default
    try:
        i = ctx.callee_arg_names.index("primals")
    except ValueError:
        return default
    any_t = AnyType(TypeOfAny.special_form)
    cts = [_cotangent_of(ctx.api, t) or any_t for t in ctx.arg_types[i]]
    out_t: Type = ft.ret_type
    aux_t: Type = any_t
    if has_aux:
        items = _items(ft.ret_type, 2)
        if items is None:
            return default
        out_t, aux_t = items
    tuple_fallback = _named(ctx.api, "builtins.tuple", [any_t])
    pullback = CallableType([any_t], [ARG_POS], [None], TupleType(cts, tuple_fallback),
                            _named(ctx.api, "builtins.function", []), name="st.vjp pullback")
    return TupleType([out_t, pullback, *([aux_t] if has_aux else [])], tuple_fallback)


# ---------------------------------------------------------------------------------------------
# The plugin

#: re-raise unexpected exceptions in hooks (the test suite sets it); otherwise a hook that
#: fails falls back to mypy's own type (no precision, no crash of the user's type check)
DEBUG: Final = bool(os.environ.get("SPMDTYPED_PLUGIN_DEBUG"))

_Ctx = TypeVar("_Ctx", FunctionContext, MethodContext, AttributeContext, AnalyzeTypeContext)


def _guarded(hook: Callable[[_Ctx], Type]) -> Callable[[_Ctx], Type]:
    def guarded(ctx: _Ctx) -> Type:
        try:
            return hook(ctx)
        except Exception:
            if DEBUG:
                raise
            if isinstance(ctx, (FunctionContext, MethodContext)):
                return ctx.default_return_type
            if isinstance(ctx, AttributeContext):
                return ctx.default_attr_type
            return AnyType(TypeOfAny.special_form)

    return guarded


def _guarded_sig(hook: Callable[[FunctionSigContext], FunctionLike]
                 ) -> Callable[[FunctionSigContext], FunctionLike]:
    def guarded(ctx: FunctionSigContext) -> FunctionLike:
        try:
            return hook(ctx)
        except Exception:
            if DEBUG:
                raise
            return ctx.default_signature

    return guarded


def read_config(config_file: str | None) -> str:
    """The `jax` setting of the `[spmdtyped]` section (`[tool.spmdtyped]` in pyproject.toml)."""
    if not config_file or not os.path.isfile(config_file):
        return "conservative"
    if config_file.endswith(".toml"):
        with open(config_file, "rb") as f:
            value = tomllib.load(f).get("tool", {}).get("spmdtyped", {}).get("jax", "conservative")
    else:
        cp = configparser.ConfigParser(interpolation=None)
        cp.read(config_file)
        value = cp.get("spmdtyped", "jax", fallback="conservative")
    value = str(value).strip()
    if value not in FEATURE_SETS:
        msg = (f"spmdtyped.mypy_plugin: [spmdtyped] jax = {value!r} in {config_file}; expected "
               f"one of {sorted(FEATURE_SETS)}")
        print(msg, file=sys.stderr)  # mypy reports only "Error constructing plugin instance"
        raise ValueError(msg)
    return value


class SpmdPlugin(Plugin):
    """Registers the hooks above on the static view's names (`spmdtyped._static`).

    Configuration (optional), in the mypy config file: `[spmdtyped]` with `jax = 0.12` (or
    `[tool.spmdtyped]` in pyproject.toml) checks with the rules of one JAX version instead of
    `conservative` (what every supported JAX allows, the default).
    """

    def __init__(self, options: Options) -> None:
        super().__init__(options)
        CONFIG.jax = read_config(options.config_file)
        CONFIG.features = FEATURE_SETS[CONFIG.jax]

    def get_type_analyze_hook(self, fullname: str) -> Callable[[AnalyzeTypeContext], Type] | None:
        return _guarded(analyze_hint(_HINTS[fullname])) if fullname in _HINTS else None

    def get_function_hook(self, fullname: str) -> Callable[[FunctionContext], Type] | None:
        hook: Callable[[FunctionContext], Type] | None = None
        if fullname in _FUNCTIONS:
            hook = collective_hook(_FUNCTIONS[fullname])
        elif fullname in _CONTROL:
            hook = control_hook(_CONTROL[fullname])
        elif fullname in _VJP:
            hook = vjp_hook
        elif fullname in _SHARD_MAP:
            hook = shard_map_hook
        elif fullname == "builtins.abs":
            hook = abs_hook
        elif fullname in _AUTODIFF:
            hook = autodiff_hook(_AUTODIFF[fullname])
        elif fullname.startswith(("st.grad(", "st.value_and_grad(")):
            hook = grad_call_hook
        elif fullname in _TABLE_FUNCTIONS:
            hook = function_hook(*_TABLE_FUNCTIONS[fullname])
        return _guarded(hook) if hook else None

    def get_function_signature_hook(self, fullname: str
                                    ) -> Callable[[FunctionSigContext], FunctionLike] | None:
        if fullname in _CONTROL:
            return _guarded_sig(control_signature_hook(_CONTROL[fullname]))
        return None

    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        cls, _, method = fullname.rpartition(".")
        if cls == OUT_SPEC_MISMATCH and method == "__call__":
            return _guarded(out_spec_call_hook)
        if cls == SHARD_MAP_DECORATOR and method == "__call__":
            return _guarded(decorator_call_hook)
        if cls != SARRAY:
            return None
        if method in _BINARY:
            return _guarded(binary_hook(method))
        if method in _UNARY:
            return _guarded(unary_hook(method))
        if method == "__getitem__":
            return _guarded(getitem_hook)
        return None

    def get_attribute_hook(self, fullname: str) -> Callable[[AttributeContext], Type] | None:
        cls, _, attr = fullname.rpartition(".")
        if cls == SARRAY and attr in _PROPERTIES:
            return _guarded(property_hook(attr))
        return None

    def report_config_data(self, ctx: ReportConfigContext) -> str | None:
        # The rule table and the JAX rule set are part of every cached result of user code.
        # Installed third-party packages and the standard library do not use spmdtyped: keep
        # their cache entries (JAX's stubs take most of a cold run) across upgrades and settings.
        if not ctx.id.startswith("spmdtyped") and (
                ctx.id.partition(".")[0] in sys.stdlib_module_names
                or any(d in Path(ctx.path).parts for d in ("site-packages", "dist-packages", "typeshed"))):
            return None
        return f"{_DIGEST}:{CONFIG.jax}"


def plugin(version: str) -> type[Plugin]:
    """mypy's entry point (`plugins = spmdtyped.mypy_plugin`)."""
    return SpmdPlugin
