"""Conversions between mypy types and the rule table's operands (`_rules.SpmdType`,
`_rules.LITERAL`), and the reading of literal arguments (axis names, keywords)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from mypy.nodes import COVARIANT, Expression, ListExpr, SetExpr, StrExpr, TupleExpr, TypeAlias, TypeInfo
from mypy.plugin import FunctionContext
from mypy.typeops import make_simplified_union
from mypy.types import (
    AnyType,
    Instance,
    LiteralType,
    ProperType,
    TupleType,
    Type,
    TypeAliasType,
    TypeOfAny,
    UninhabitedType,
    UnionType,
    get_proper_type,
)

from .. import _rules
from .._errors import SpmdTypeError
from .._rules import LITERAL, SpmdType

# Hooks are keyed by the definition site: the static view lives in spmdtyped._static.
STATIC: Final = "spmdtyped._static"
SARRAY: Final = f"{STATIC}.SArray"
_SCALARS: Final = ("builtins.int", "builtins.float", "builtins.bool", "builtins.complex")
#: where JAX's stubs define the array types (jax 0.10.2 and 0.12: `jax.Array`,
#: `jax.typing.ArrayLike` and `jax.sharding.PartitionSpec` are re-exports of these)
ARRAY: Final = ("jax._src.basearray", "Array")
ARRAY_LIKE: Final = ("jax._src.basearray", "ArrayLike")
PARTITION_SPEC: Final = ("jax._src.partition_spec", "PartitionSpec")


class Unknown:
    """An operand whose state cannot be known statically (raw jax.Array, Any, a join)."""


UNKNOWN: Final = Unknown()
#: a known operand state: an SpmdType or LITERAL (`_rules.Operand`)
Known = _rules.Operand


def any_type() -> AnyType:
    return AnyType(TypeOfAny.special_form)


def axes_of(t: Type) -> frozenset[str] | None:
    """The axis set one SArray argument stands for (None: not a set of str Literals)."""
    p = get_proper_type(t)
    if isinstance(p, UninhabitedType):
        return frozenset()
    if isinstance(p, LiteralType) and isinstance(p.value, str):
        return frozenset((p.value,))
    if isinstance(p, UnionType):
        out: set[str] = set()
        for item in p.items:
            s = axes_of(item)
            if s is None:
                return None
            out |= s
        return frozenset(out)
    return None


def _fallback_name(p: ProperType) -> str | None:
    if isinstance(p, LiteralType):
        return p.fallback.type.fullname
    return p.type.fullname if isinstance(p, Instance) else None


def is_scalar(p: ProperType) -> bool:
    return _fallback_name(p) in _SCALARS


def is_python_int(p: ProperType) -> bool:
    """An `int` (not a bool): the runtime binds `x ** k` with an int `k` as `integer_pow`."""
    return _fallback_name(p) == "builtins.int"


def is_str(t: Type) -> bool:
    return _fallback_name(get_proper_type(t)) == "builtins.str"


def is_sarray(t: Type) -> bool:
    p = get_proper_type(t)
    return isinstance(p, Instance) and p.type.fullname == SARRAY


def state_of_args(args: tuple[Type, ...] | list[Type]) -> SpmdType | None:
    """The state of `SArray[V, U, R, K]`-like type arguments (None: not literal); the
    refinement slot `K` is read by `refined`."""
    if len(args) not in (3, 4):
        return None
    v, u, r = args[0], args[1], args[2]
    # first by identity (hashing a mypy union is costly; a variable's declared type and the
    # hooks' own results reuse the same argument objects), then by value
    seen = _SEEN.get((id(v), id(u), id(r)))
    if seen is not None and seen[0] is v and seen[1] is u and seen[2] is r:
        return seen[3]
    key = (v, u, r)
    try:
        state = _STATES[key]
    except KeyError:
        if len(_STATES) > 4096:
            _STATES.clear()
        state = _STATES[key] = _state_of(key)
    except TypeError:  # an unhashable type argument: read it every time
        return _state_of(key)
    if len(_SEEN) > 4096:
        _SEEN.clear()
    _SEEN[(id(v), id(u), id(r))] = (v, u, r, state)  # holds the objects: their ids stay theirs
    return state


#: type arguments -> state (the hooks read the same few states over and over)
_STATES: Final[dict[tuple[Type, Type, Type], SpmdType | None]] = {}
_SEEN: Final[dict[tuple[int, int, int], tuple[Type, Type, Type, SpmdType | None]]] = {}


def _state_of(args: tuple[Type, Type, Type]) -> SpmdType | None:
    v, u, r = (axes_of(a) for a in args)
    if v is None or u is None or r is None:
        return None
    try:
        return SpmdType(v, u, r)
    except SpmdTypeError:
        return None


def to_operand(t: Type) -> Known | Unknown:
    """A mypy type as a rule-table operand: an SpmdType, LITERAL (a Python scalar) or UNKNOWN."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY:
        state = state_of_args(p.args)
        return UNKNOWN if state is None else state
    if is_scalar(p):
        return LITERAL
    return UNKNOWN


def named(api: Any, fullname: str, args: list[Type]) -> Instance:
    """An instance of `fullname` (`api`: a checker or a type analyser)."""
    # The checker's lookup walks `spmdtyped` -> `_static` through package attributes, which a
    # star import does not create: look the class up in the module table instead.
    modules = getattr(api, "modules", None)
    if modules is not None:
        module, _, name = fullname.rpartition(".")
        node = modules[module].names[name].node
        assert isinstance(node, TypeInfo)
        return Instance(node, args)
    return api.named_type(fullname, args)  # type: ignore[no-any-return]


def str_type(api: Any) -> Instance:
    return named(api, "builtins.str", [])


def tuple_of(api: Any, items: list[Type]) -> TupleType:
    return TupleType(items, named(api, "builtins.tuple", [any_type()]))


class _Built:
    """The axis unions built in one run (the hooks build the same few over and over): valid
    while `builtins.str` is the same TypeInfo (a new run, or a daemon's reload, starts afresh).
    The unions (and `Never`) are shared by the results: mypy does not mutate types, and the
    shared objects let `state_of_args` read them back by identity."""

    str_info: TypeInfo | None = None
    axes: dict[frozenset[str], Type] = {}
    states: dict[SpmdType, tuple[Type, Type, Type]] = {}

    @classmethod
    def check(cls, s: Instance) -> None:
        if cls.str_info is not s.type:
            cls.str_info, cls.axes, cls.states = s.type, {}, {}


def _axes(s: Instance, axes: frozenset[str]) -> Type:
    t = _Built.axes.get(axes)
    if t is None:
        t = _Built.axes[axes] = (make_simplified_union([LiteralType(a, s) for a in sorted(axes)])
                                 if axes else UninhabitedType())
    return t


def axes_type(api: Any, axes: frozenset[str]) -> Type:
    """The union of str Literals for an axis set (`Never` for the empty set)."""
    s = str_type(api)
    _Built.check(s)
    return _axes(s, axes)


def from_spmd(api: Any, t: SpmdType) -> Instance:
    """`SArray[V, U, R, Any]` for an SpmdType (no refinement: see `refined.encode`)."""
    s = str_type(api)
    _Built.check(s)
    args = _Built.states.get(t)
    if args is None:
        args = _Built.states[t] = (_axes(s, t.varying), _axes(s, t.unreduced), _axes(s, t.reduced))
    return named(api, SARRAY, [*args, any_type()])


def alternatives(api: Any, t: Type, expr: Expression | None) -> list[Known] | None:
    """The operand states an argument may have: several for a union (e.g. a ternary of
    incompatible states), None when any of them is unknown."""
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY and expr is not None \
            and isinstance(to_operand(p), Unknown):
        # A generic call in argument position may have inferred Any from the stub's
        # SArray[Any, Any, Any] parameter: infer the argument again without that context.
        p = get_proper_type(api.get_expression_type(expr, None))
    items = p.items if isinstance(p, UnionType) else [p]
    out: list[Known] = []
    for item in items:
        o = to_operand(item)
        if isinstance(o, Unknown) and _constant(api, item, expr if len(items) == 1 else None):
            o = _rules.INVARIANT
        if isinstance(o, Unknown) or len(out) >= 8:
            return None
        out.append(o)
    return out


def _constant(api: Any, t: Type, expr: Expression | None) -> bool:
    """An array constant (`constants`): a numpy value, or a `jax.Array` built from constants
    only (`jnp.ones(4)`, a mask of `jnp.tril`): Invariant, as JAX makes it inside shard_map."""
    from . import constants  # on the first operand of unknown state (most programs have none)

    if constants.is_numpy(t):
        return True
    p = get_proper_type(t)
    return expr is not None and isinstance(p, Instance) and p.type.fullname == constants.JAX_ARRAY \
        and constants.is_constant(api, expr)


def arrays_only(alts: list[Known]) -> list[SpmdType]:
    """Operand alternatives with a Python scalar read as Invariant (a unary op's operand)."""
    return [_rules.INVARIANT if o is LITERAL else o for o in alts]  # type: ignore[misc]


# ------------------------------------------------------------------------- literal arguments


def literal_value(t: Type) -> object:
    """The value of a literal type (or of a `Final` constant's last known value), else None."""
    p = get_proper_type(t)
    if isinstance(p, LiteralType):
        return p.value
    if isinstance(p, Instance) and p.last_known_value is not None:
        return p.last_known_value.value
    return None


def axis_value(expr: Expression, t: Type) -> object:
    """An axis_name argument's value (str, tuple, list or set of str), None if not static."""
    if isinstance(expr, (ListExpr, SetExpr)) and all(isinstance(i, StrExpr) for i in expr.items):
        values = [i.value for i in expr.items if isinstance(i, StrExpr)]
        return values if isinstance(expr, ListExpr) else set(values)
    if isinstance(expr, TupleExpr):
        return tuple(axis_value(i, any_type()) for i in expr.items)
    if isinstance(expr, StrExpr):
        return expr.value
    p = get_proper_type(t)
    if isinstance(p, TupleType):
        return tuple(literal_value(i) for i in p.items)
    return literal_value(p)


def arg(ctx: FunctionContext, name: str) -> tuple[Expression, Type] | None:
    """The (expression, type) passed for the callee's parameter `name`, if any."""
    names = ctx.callee_arg_names
    if name not in names:
        return None
    i = names.index(name)
    if not ctx.args[i]:
        return None
    return ctx.args[i][0], ctx.arg_types[i][0]


def arg_type(ctx: FunctionContext, name: str) -> Type | None:
    a = arg(ctx, name)
    return a[1] if a else None


def positional(ctx: FunctionContext) -> list[tuple[Expression, Type]]:
    """The positional arguments as written at the call."""
    out = []
    for kinds, exprs, types in zip(ctx.arg_kinds, ctx.args, ctx.arg_types, strict=True):
        for kind, expr, t in zip(kinds, exprs, types, strict=True):
            if kind.is_positional():
                out.append((expr, t))
    return out


def keyword(ctx: FunctionContext, name: str) -> tuple[Expression, Type] | None:
    """The keyword argument `name` as written at the call."""
    for names, exprs, types in zip(ctx.arg_names, ctx.args, ctx.arg_types, strict=True):
        for n, expr, t in zip(names, exprs, types, strict=True):
            if n == name:
                return expr, t
    return None


def tuple_items(t: Type, n: int) -> list[Type] | None:
    """The `n` items of a tuple type (a fixed tuple, or `tuple[X, ...]`)."""
    p = get_proper_type(t)
    if isinstance(p, TupleType):
        return list(p.items) if len(p.items) == n else None
    if isinstance(p, Instance) and p.type.fullname == "builtins.tuple" and len(p.args) == 1:
        return [p.args[0]] * n
    return None


def jax_type(api: Any, where: tuple[str, str]) -> Type | None:
    """`jax.Array` / `jax.typing.ArrayLike` / `PartitionSpec` from the module table (None: JAX
    not analysed)."""
    module = getattr(api, "modules", {}).get(where[0])
    sym = module.names.get(where[1]) if module is not None else None
    node = sym.node if sym is not None else None
    if isinstance(node, TypeInfo):
        return Instance(node, [any_type()] * len(node.defn.type_vars))
    if isinstance(node, TypeAlias):
        return TypeAliasType(node, [])
    return None


def contains_sarray(t: Type) -> bool:
    """Whether a typed value is somewhere in `t` (tuples, unions, type arguments)."""
    p = get_proper_type(t)
    if is_sarray(p):
        return True
    if isinstance(p, TupleType):
        return any(contains_sarray(i) for i in p.items)
    if isinstance(p, UnionType):
        return any(contains_sarray(i) for i in p.items)
    if isinstance(p, Instance):
        return any(contains_sarray(a) for a in p.args)
    return False


def map_typed(t: Type, replace: Callable[[Instance], Type], *, covariant: bool,
              anywhere: bool = False) -> Type:
    """Every typed value `s` in `t` replaced by `replace(s)`. A parameter's type argument that
    is not covariant (`dict[str, Varying["dp"]]`) becomes `Any` where it holds typed values (no
    single replacement is right there); an output's (`anywhere`) is replaced everywhere."""
    if not contains_sarray(t):
        return t
    p = get_proper_type(t)
    if isinstance(p, Instance) and p.type.fullname == SARRAY:
        return replace(p) if covariant or anywhere else any_type()
    if isinstance(p, TupleType):
        return p.copy_modified(items=[map_typed(i, replace, covariant=covariant, anywhere=anywhere)
                                      for i in p.items])
    if isinstance(p, UnionType):
        return UnionType.make_union([map_typed(i, replace, covariant=covariant, anywhere=anywhere)
                                     for i in p.items])
    if isinstance(p, Instance):
        tvars = p.type.defn.type_vars
        args = [map_typed(a, replace, anywhere=anywhere,
                          covariant=covariant and getattr(tv, "variance", None) == COVARIANT)
                for a, tv in zip(p.args, tvars, strict=False)]
        return p.copy_modified(args=args + list(p.args[len(args):]))
    return t
