"""Hints: `Varying["dp"]`, `Varying["dp", "tp"]`, `Varying["dp | tp"]`, `Reduced["tp"]`,
`Unreduced["tp"]`, `Typed[Varying["dp"], Reduced["tp"]]` (and an alias of a family, `Fam =
Varying`) become the standard type `SArray[V, U, R]`. Bare strings need no declaration; when
the module has an axis vocabulary (`dp: TypeAlias = Literal["dp"]`), an undeclared axis stays
a `name-defined` error. Hints are validated by the runtime's own subscription (`_hints.Varying[...]`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from mypy import errorcodes
from mypy.nodes import ARG_OPT, ARG_POS, FuncDef, SymbolTableNode, TypeAlias
from mypy.plugin import AnalyzeTypeContext
from mypy.typeops import make_simplified_union
from mypy.types import (
    AnyType,
    Instance,
    LiteralType,
    RawExpressionType,
    Type,
    TypeOfAny,
    TypeVarType,
    UnboundType,
    UninhabitedType,
    UnionType,
    get_proper_type,
)

from .._errors import SpmdTypeError, error
from .._rules import SpmdType
from .._rules import refine as _refine
from .._rules.refine import shape as _refine_shape
from .._typed import hints as _hints
from . import meshes, refined, returns
from .codes import CODES, SPMD
from .convert import SARRAY, STATIC, axes_of, from_spmd, to_operand

FAMILIES: Final = ("Varying", "Unreduced", "Reduced", "Typed", "Shard", "Partial", "Rep")
#: the refinements of Varying (DESIGN.md §1b): `Shard[axis, dim]`, `Partial[axis]`, `Rep[axis]`
_REFINING: Final = {"Partial": _refine.PARTIAL, "Rep": _refine.REP}
#: jaxtyping's array hints in the static view (`Annotated` for checkers): `Float[hint, dims]`
JAXTYPING: Final = frozenset({"Bool", "Float", "Inexact", "Int", "Num", "Shaped"})
ANNOTATED: Final = ("typing.Annotated", "typing_extensions.Annotated")
#: the hint families' full names (the static view's and the package's re-export)
FULLNAMES: Final = {f"{m}.{f}": f for m in (STATIC, "spmdtyped") for f in FAMILIES}


def family_of_alias(fullname: str, lookup: Callable[[str], SymbolTableNode | None]) -> str | None:
    """The hint family a user alias stands for (`Fam = Varying` -> "Varying"), else None.

    The alias's target is what `analyze` made of the bare family: `SArray` with the special
    form `Any` in the family's slots and `Never` elsewhere (`Typed`: `Any` everywhere)."""
    sym = lookup(fullname)
    node = sym.node if sym is not None else None
    if not isinstance(node, TypeAlias):
        return None
    target = get_proper_type(node.target)
    if not (isinstance(target, Instance) and target.type.fullname == SARRAY and len(target.args) == 4):
        return None
    slots = [get_proper_type(a) for a in target.args[:3]]
    special = [isinstance(a, AnyType) and a.type_of_any == TypeOfAny.special_form for a in slots]
    if all(special):
        return "Typed"
    if special.count(True) == 1 and all(isinstance(a, UninhabitedType) for a, s in zip(slots, special, strict=True) if not s):
        return ("Varying", "Unreduced", "Reduced")[special.index(True)]
    return None


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


def _drop_errors(api: Any, spurious: Callable[[Any], bool]) -> None:
    """Remove the errors of the current file that `spurious` matches: mypy's own errors about
    hint syntax that the type-analyze hook reads as intended (`_drop_name_defined`,
    `_drop_literal_dim`). Internal API (mypy 1.15-2.x), hence the try/except: without it the
    only consequence is a visible spurious error."""
    try:
        errors = api.api.errors
        infos = errors.error_info_map.get(errors.file)
        if infos:
            infos[:] = [i for i in infos if not spurious(i)]
    except Exception:  # noqa: BLE001 - internal API; never break type checking over it
        pass


def _drop_name_defined(api: Any, t: UnboundType) -> None:
    """Remove mypy's spurious `Name "dp" is not defined` for a bare-string axis: mypy's semantic
    analyser looks up every name inside `X[...]` (to find TypeVars) before this hook runs and
    reports string forward references it cannot resolve."""
    needle = f'"{t.name}"'
    _drop_errors(api, lambda i: i.code is errorcodes.NAME_DEFINED and i.line == t.line
                 and needle in i.message)


def _drop_literal_dim(api: Any, t: RawExpressionType) -> None:
    """Remove mypy's spurious `Invalid type: try using Literal[0] instead?` for the dim of a
    `Shard["tp", 0]` written in a type alias (`QKV = Typed[Shard["dp", 0], Shard["tp", 1]]`):
    mypy's semantic analyser first analyses an alias's right-hand side as an expression, where
    `Shard[...]` is a type application whose arguments it types one by one, without this hook;
    the hook then reads the same argument as the dim."""
    message = f"Invalid type: try using Literal[{t.literal_value!r}] instead?"
    _drop_errors(api, lambda i: i.code is errorcodes.VALID_TYPE and i.line == t.line
                 and i.column == t.column and i.message == message)


class HintArgs:
    """The analysed arguments of one hint: axis names, nested states, type-level slots."""

    def __init__(self) -> None:
        self.axes: list[str] = []
        self.nested: list[SpmdType] = []
        self.slots: list[tuple[int, Type]] = []  # (slot index, type) for TypeVars / Any
        self.dims: list[int] = []  # Shard[axis, dim]: the dim
        self.kinds: dict[str, Any] = {}  # refinements of nested hints (`refined.read_k`)
        self.rank: int | None = None


def _bare_string(api: Any, arg: UnboundType, out: HintArgs, in_string: bool = False) -> bool:
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


def _hint_arg(api: Any, arg: Type, out: HintArgs, family: str, slot: int) -> str | None:
    """Collect one argument; returns an error headline for a non-axis argument."""
    if isinstance(arg, UnboundType) and _bare_string(api, arg, out):
        return None
    if isinstance(arg, RawExpressionType) and isinstance(arg.literal_value, int) \
            and not isinstance(arg.literal_value, bool) and family in ("Shard", "Partial", "Rep"):
        out.dims.append(arg.literal_value)  # Shard["tp", -1] (the plugin's spelling)
        _drop_literal_dim(api, arg)
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
            kinds, rank = refined.read_k(analysed.args[3]) if len(analysed.args) == 4 else ({}, None)
            out.kinds.update(kinds)
            out.rank = rank if rank is not None else out.rank
        else:
            out.slots.extend((i, a) for i, a in enumerate(analysed.args[:3])
                             if not isinstance(get_proper_type(a), UninhabitedType))
        return None
    if isinstance(analysed, TypeVarType):
        out.slots.append((slot, analysed))
        return None
    if family == "Shard" and isinstance(analysed, LiteralType) and isinstance(analysed.value, int) \
            and not isinstance(analysed.value, bool):
        out.dims.append(analysed.value)  # Shard["tp", Literal[-1]] (every checker's spelling)
        return None
    axes = axes_of(analysed)
    if axes is not None:
        out.axes.extend(sorted(axes))
        return None
    return f"{family}[...]: {analysed} is not an axis name (use a str or Literal[...])"


def analyze(ctx: AnalyzeTypeContext, family: str) -> Type:
    """The type-analyze hook of hint family `family`: the `SArray[V, U, R]` a hint stands for."""
    t, api = ctx.type, ctx.api
    returns.install(getattr(getattr(api, "api", None), "errors", None))
    slot = {"Varying": 0, "Unreduced": 1, "Reduced": 2}.get(family, 0)
    refining = family in ("Shard", "Partial", "Rep")
    refinement = family
    if refining:
        family = "Varying"
    if not t.args:
        anys = [AnyType(TypeOfAny.special_form) if family in ("Typed", f) else UninhabitedType()
                for f in ("Varying", "Unreduced", "Reduced")]
        return api.named_type(SARRAY, [*anys, AnyType(TypeOfAny.special_form)])
    out = HintArgs()
    for arg in t.args:
        problem = _hint_arg(api, arg, out, refinement if refining else family, slot)
        if problem:
            err = error("SPMD504", problem)
            api.fail(err.headline, t, code=CODES["SPMD504"])
            return AnyType(TypeOfAny.from_error)
    if refining:
        kind_error = _refinement(out, refinement)
        if kind_error:
            err = error("SPMD504", kind_error)
            api.fail(err.headline, t, code=CODES["SPMD504"])
            return AnyType(TypeOfAny.from_error)
    hint = f"{refinement if refining else family}[{', '.join(map(repr, out.axes))}]"
    unknown = meshes.unknown_axis(api, out.axes, hint)
    if unknown is not None:  # a typo of the module's mesh axes: here, not a later mismatch
        api.fail(unknown.headline, t, code=CODES[unknown.code])
        return AnyType(TypeOfAny.from_error)
    try:
        params = tuple(out.axes) + tuple(_hints.state_class(n) for n in out.nested)
        if out.slots and not params:
            state = SpmdType()
        else:
            # the runtime's own subscription: same validation, same canonical state
            cls = getattr(_hints, family)[params]
            state = _hints.hint_type(cls) or SpmdType()
    except SpmdTypeError as err:
        api.fail(err.headline, t, code=CODES.get(err.code, SPMD))
        return AnyType(TypeOfAny.from_error)
    assert state is not None
    result = from_spmd(api, state)
    kinds = {a: k for a, k in out.kinds.items() if a in state.varying}
    if state.varying:
        kinds = in_spec_kinds(api, t, state, kinds, out.rank)
    if kinds or out.rank is not None:
        result = result.copy_modified(args=[*result.args[:3], refined.k_type(api, kinds, out.rank)])
    if not out.slots:
        return result
    args = list(result.args)
    for i, extra in out.slots:  # TypeVars (generic user code) and Any join the slot's union
        args[i] = extra if isinstance(get_proper_type(args[i]), UninhabitedType) else \
            make_simplified_union([args[i], extra])
    return result.copy_modified(args=args)




def in_spec_kinds(api: Any, t: Type, state: SpmdType, kinds: dict[str, Any], rank: int | None
                  ) -> dict[str, Any]:
    """`kinds` with the Shard dims a literal `@st.shard_map(in_specs=...)` gives the parameter
    whose hint `t` is (`_refine_shape.from_spec`, the runtime's rule), on the Varying axes the
    hint leaves plain. The rank unknown: the dims stay counted from the left (as a
    `Shard["dp", 0]` hint), resolved where the rank is known."""
    defn = getattr(getattr(api, "api", None), "statement", None)
    if not (isinstance(defn, FuncDef) and defn.is_decorated and defn.type is not None):
        return kinds
    ft = defn.type
    index = 0
    for arg_t, kind in zip(getattr(ft, "arg_types", ()), getattr(ft, "arg_kinds", ()), strict=False):
        if arg_t is t:
            if kind not in (ARG_POS, ARG_OPT):
                return kinds
            break
        index += kind in (ARG_POS, ARG_OPT)
    else:
        return kinds
    try:
        sym = api.api.lookup_current_scope(defn.name)
    except Exception:  # noqa: BLE001 - internal API: no refinement
        return kinds
    from . import boundary  # noqa: PLC0415 - a feature module, loaded on first use (`_mypy.names`)

    found = boundary.param_in_spec(sym.node if sym is not None else None, index)
    if found is None:
        return kinds
    spec, manual = found
    ref = _refine_shape.from_spec(spec.entries, rank, manual if manual is not None else spec.partitioned)
    extra: dict[str, Any] = {}
    for a, k in ref.items:
        if a in state.varying and a not in kinds and isinstance(k, _refine.Shard):
            extra[a] = k if k.dim < 0 else k.dim  # from the left: the rank is not known
    return {**kinds, **extra} if extra else kinds


def _refinement(out: HintArgs, family: str) -> str | None:
    """The kinds a `Shard[axes, dim]` / `Partial[axes]` / `Rep[axes]` hint declares (into
    `out.kinds`); an error headline for a malformed one."""
    if family == "Shard":
        if len(out.dims) != 1 or not out.axes:
            return "Shard[...]: write the axis and the dim, e.g. Shard['tp', -1] (the last dim sharded over 'tp')"
        dim = out.dims[0]
        for a in out.axes:
            out.kinds[a] = _refine.Shard(dim) if dim < 0 else dim  # from the left: rank needed
        return None
    if out.dims or not out.axes:
        return f"{family}[...]: write one or more axis names, e.g. {family}['tp']"
    for a in out.axes:
        out.kinds[a] = _REFINING[family]
    return None


_DIM_MODIFIERS: Final = "*#_?"


def _dims_string(arg: Type) -> str | None:
    if isinstance(arg, RawExpressionType) and isinstance(arg.literal_value, str):
        return arg.literal_value
    if isinstance(arg, UnboundType) and arg.original_str_expr is not None:
        return arg.original_str_expr
    return None


def annotated(ctx: AnalyzeTypeContext) -> Type:
    """`Annotated[...]`: jaxtyping's `st.Float[Varying["tp"], "b d/tp"]` (the static view's
    `Float` is `Annotated`) gets the rank and the Shard of each `name/axis` dim; any other
    `Annotated` is mypy's own."""
    t, api = ctx.type, ctx.api
    name = t.name.rpartition(".")[2]
    dims = _dims_string(t.args[1]) if name in JAXTYPING and len(t.args) == 2 else None
    if dims is None:
        special = getattr(api, "try_analyze_special_unbound_type", None)
        if special is not None:
            result = special(t, "typing.Annotated")
            if result is not None:
                return result  # type: ignore[no-any-return]
        return api.analyze_type(t.args[0]) if len(t.args) >= 2 else AnyType(TypeOfAny.from_error)
    inner = get_proper_type(api.analyze_type(t.args[0]))
    if not (isinstance(inner, Instance) and inner.type.fullname == SARRAY and len(inner.args) == 4):
        return inner
    state = to_operand(inner)
    if not isinstance(state, SpmdType):
        return inner
    kinds, _ = refined.read_k(inner.args[3])
    tokens = dims.split()
    variadic = [i for i, tok in enumerate(tokens) if tok.startswith("*") or tok == "..."]
    rank = None if variadic else len(tokens)
    first_known = (variadic[-1] + 1) if variadic else 0
    for i, tok in enumerate(tokens):
        if "/" not in tok or i < first_known:
            continue
        axes_text = tok.split("/", 1)[1].strip("()")
        for a in (x.strip() for x in axes_text.split(",")):
            if a in state.varying and a not in kinds:
                kinds[a] = _refine.Shard(i - len(tokens))
    kinds = in_spec_kinds(api, t, state, kinds, rank)
    for a, k in list(kinds.items()):
        if isinstance(k, int):  # Shard["tp", 0]: counted from the left, now that the rank is known
            if rank is not None and k < rank:
                kinds[a] = _refine.Shard(k - rank)
            else:
                del kinds[a]
    # the rank is kept even with no refined axis: an index or `broadcast_to` of the value can
    # then place its dims (`sinks[:h, None, None]`, `Refinement.extents`)
    return inner.copy_modified(args=[*inner.args[:3], refined.k_type(api, kinds, rank, keep_rank=True)])
