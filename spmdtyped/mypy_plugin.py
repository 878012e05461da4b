"""The spmdtyped mypy plugin: precise manual-axis states for every hint, collective and operator.

Enable it with `plugins = spmdtyped.mypy_plugin` in the mypy configuration.

How it works (see `shared/reference/mypy_plugin_study.md` and `docs/static.md`):

- **Hints.** `Varying["dp"]`, `Varying["dp", "tp"]`, `Varying["dp | tp"]`, `Reduced["tp"]`,
  `Unreduced["tp"]`, `Typed[Varying["dp"], Reduced["tp"]]` become the standard type
  `SArray[V, U, R]` (each argument a union of str Literals, `Never` for the empty set). Bare
  strings need no declaration; when the module has an axis vocabulary
  (`dp: TypeAlias = Literal["dp"]`), an undeclared axis stays a `name-defined` error. Hints are
  validated by the runtime's own `_hints._subscript`.
- **Results.** Every collective, cast, operator, array method, `st.numpy` function named after
  its rule and `st.grad`/`st.value_and_grad` converts its operands to `_rules.SpmdType`, calls
  the rule table (`_rules.axis_op`, `combine`, `unary`, `normalize_axes`, `cotangent`,
  `grad_loss_type`) with `_rules.CONSERVATIVE` features (or one JAX version's, configured with
  `[spmdtyped] jax = 0.12`) and converts the result back. No rule is encoded here.
- **Errors.** A `SpmdTypeError` is reported with its runtime headline under the error code
  `spmd-<slug>` of its SPMD code (a sub-code of `spmd`), followed by a note with the fix.
- **Unknown states.** Raw `jax.Array` values, `Any`, non-literal axis names: no error, the
  result is `SArray[Any, Any, Any]` (the opt-in code `spmd-axis` reports non-literal axes).

The plugin imports no JAX (only `spmdtyped._rules`, `_errors` and `_hints`), uses only
standard mypy types (so the incremental cache and dmypy work), and reports a hash of the rule
table as its configuration data so that cached results are invalidated when the rules change.
"""

from __future__ import annotations

import configparser
import hashlib
import itertools
import os
import sys
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

from mypy import errorcodes
from mypy.errorcodes import ErrorCode
from mypy.nodes import (
    Context,
    Expression,
    IntExpr,
    ListExpr,
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
    MethodContext,
    Plugin,
    ReportConfigContext,
)
from mypy.typeops import make_simplified_union
from mypy.types import (
    AnyType,
    CallableType,
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


# How `st.numpy` binds each rule (spmdtyped/numpy.py): joins take a sequence, these take every
# array argument, the rest act on their first argument only (further arguments are shapes,
# axes, shifts). Only functions named after their rule are typed here; numpy.py's `RULES`
# (aliases such as subtract -> sub) lives in a JAX-importing module the plugin cannot load.
_NUMPY_JOINS: Final = frozenset({"concatenate", "stack"})
_NUMPY_NARY: Final = frozenset({"where", "einsum", "add", "maximum", "minimum", "arctan2", "mod",
                                "dot", "matmul"})
_NUMPY_SKIP: Final = frozenset({"take"})  # its rule depends on the index's state at runtime


def _positional(ctx: FunctionContext) -> list[tuple[Expression, Type]]:
    out = []
    for kinds, exprs, types in zip(ctx.arg_kinds, ctx.args, ctx.arg_types, strict=True):
        for kind, expr, t in zip(kinds, exprs, types, strict=True):
            if kind.is_positional():
                out.append((expr, t))
    return out


def numpy_hook(name: str) -> Callable[[FunctionContext], Type]:
    """`st.numpy.<name>(...)`: the table's rule on the array/scalar arguments."""
    op = f"st.numpy.{name}"

    def hook(ctx: FunctionContext) -> Type:
        default = ctx.default_return_type
        args = _positional(ctx)
        if not args:
            return default
        if name in _NUMPY_JOINS:
            seq = args[0][0]
            if not isinstance(seq, (ListExpr, TupleExpr)):
                return default
            operands = [(item, ctx.api.get_expression_type(item, None)) for item in seq.items]
        elif name in _NUMPY_NARY:
            operands = [(e, t) for e, t in args if not _is_str(t)]  # einsum's subscripts
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
        if len(alts) == 1 and name not in _NUMPY_JOINS | _NUMPY_NARY:
            alts = [[_rules.INVARIANT if o is LITERAL else o for o in alts[0]]]
            return _apply(ctx.api, ctx.context, default, alts,
                          lambda t: _rules.unary(name, t, CONFIG.features, op=op))
        return _apply(ctx.api, ctx.context, default, alts,
                      lambda *ts: _rules.combine(name, list(ts), CONFIG.features, op=op).type)

    return hook


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


def autodiff_hook(name: str) -> Callable[[FunctionContext], Type]:
    """`st.grad(f, argnums)` / `st.value_and_grad(f, argnums)`: a function with `f`'s parameters
    whose gradients have the cotangent state of each differentiated parameter's annotation
    (`_rules.cotangent`), and whose loss is checked with `_rules.grad_loss_type` (SPMD405)."""
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
            t = to_operand(ft.arg_types[k])
            grads.append(from_spmd(ctx.api, _rules.cotangent(t)) if isinstance(t, SpmdType) else any_t)
        tuple_fallback = _named(ctx.api, "builtins.tuple", [any_t])
        grads_t = grads[0] if isinstance(nums, int) else TupleType(grads, tuple_fallback)
        if name == "grad":
            ret_t: Type = TupleType([grads_t, aux_t], tuple_fallback) if has_aux else grads_t
        else:
            value_t = TupleType([loss_t, aux_t], tuple_fallback) if has_aux else loss_t
            ret_t = TupleType([value_t, grads_t], tuple_fallback)
        return ft.copy_modified(ret_type=ret_t)

    return hook


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
        elif fullname == "builtins.abs":
            hook = abs_hook
        elif fullname in _AUTODIFF:
            hook = autodiff_hook(_AUTODIFF[fullname])
        elif fullname.startswith("spmdtyped.numpy."):
            short = fullname.rpartition(".")[2]
            if short in _rules.ELEMENTWISE and short not in _NUMPY_SKIP:
                hook = numpy_hook(short)
        return _guarded(hook) if hook else None

    def get_method_hook(self, fullname: str) -> Callable[[MethodContext], Type] | None:
        cls, _, method = fullname.rpartition(".")
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
