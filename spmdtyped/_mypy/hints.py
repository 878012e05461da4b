"""Hints: `Varying["dp"]`, `Varying["dp", "tp"]`, `Varying["dp | tp"]`, `Reduced["tp"]`,
`Unreduced["tp"]`, `Typed[Varying["dp"], Reduced["tp"]]` (and an alias of a family, `Fam =
Varying`) become the standard type `SArray[V, U, R]`. Bare strings need no declaration; when
the module has an axis vocabulary (`dp: TypeAlias = Literal["dp"]`), an undeclared axis stays
a `name-defined` error. Hints are validated by the runtime's own subscription (`_hints.Varying[...]`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from mypy import errorcodes
from mypy.nodes import SymbolTableNode, TypeAlias
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

from .. import _hints
from .._errors import SpmdTypeError, error
from .._rules import SpmdType
from .codes import CODES, SPMD
from .convert import SARRAY, STATIC, axes_of, from_spmd, to_operand

FAMILIES: Final = ("Varying", "Unreduced", "Reduced", "Typed")
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
    if not (isinstance(target, Instance) and target.type.fullname == SARRAY and len(target.args) == 3):
        return None
    slots = [get_proper_type(a) for a in target.args]
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


class HintArgs:
    """The analysed arguments of one hint: axis names, nested states, type-level slots."""

    def __init__(self) -> None:
        self.axes: list[str] = []
        self.nested: list[SpmdType] = []
        self.slots: list[tuple[int, Type]] = []  # (slot index, type) for TypeVars / Any


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
    axes = axes_of(analysed)
    if axes is not None:
        out.axes.extend(sorted(axes))
        return None
    return f"{family}[...]: {analysed} is not an axis name (use a str or Literal[...])"


def analyze(ctx: AnalyzeTypeContext, family: str) -> Type:
    """The type-analyze hook of hint family `family`: the `SArray[V, U, R]` a hint stands for."""
    t, api = ctx.type, ctx.api
    slot = {"Varying": 0, "Unreduced": 1, "Reduced": 2}.get(family, 0)
    if not t.args:
        anys = [AnyType(TypeOfAny.special_form) if family in ("Typed", f) else UninhabitedType()
                for f in ("Varying", "Unreduced", "Reduced")]
        return api.named_type(SARRAY, list[Type](anys))
    out = HintArgs()
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
            cls = getattr(_hints, family)[params]
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


