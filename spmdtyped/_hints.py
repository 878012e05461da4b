"""Runtime hint objects: `Varying["dp"]`, `Reduced["tp"]`, `Unreduced["tp"]`, `Invariant`, `Typed[...]`.

Each state (an `SpmdType`) has exactly one cached class, and every typed value's concrete
class *is* its state class, so an exact `isinstance`/beartype check is one class test
(CPython short-circuits `type(obj) is cls`). The metaclass `__instancecheck__` only runs for
the covariant case (a value less varying than the hint; its verdict is cached per pair of
classes, one dict lookup) and for raw JAX values inside shard_map, whose state is read from
JAX each time.

Imports no JAX: operator methods reach `_array` lazily, raw-value checks go through
`_compat` only when JAX is already imported.
"""

from __future__ import annotations

import functools
import re
import sys
import typing
from collections.abc import Callable
from typing import Any

from ._errors import error
from ._rules import INVARIANT, SpmdType

_AXIS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")

#: called with each new state class (``_array`` registers them as pytrees)
_class_hooks: list[Callable[[type], None]] = []
#: every state class made so far
_made: list[type] = []


#: `_compat.typeof_raw_or_none`, bound on first use (a function-level import per check cost
#: ~1 us of the per-argument budget)
_typeof_raw_or_none: Callable[[object], SpmdType | None] | None = None


def _raw_typeof(obj: object) -> SpmdType | None:
    """The state of a raw JAX value (None when `obj` is not one, or JAX is not in use)."""
    global _typeof_raw_or_none
    if _typeof_raw_or_none is None:
        if "jax" not in sys.modules:
            return None
        from . import _compat

        _typeof_raw_or_none = _compat.typeof_raw_or_none
    return _typeof_raw_or_none(obj)


def spmd_type_of(obj: object) -> SpmdType | None:
    if isinstance(type(obj), _StateMeta):
        return type(obj)._spmd_type  # type: ignore[attr-defined,no-any-return]
    return _raw_typeof(obj)


class _StateMeta(type):
    """Metaclass of state classes. Never override `__repr__` here (beartype compares reprs)."""

    _spmd_type: SpmdType | None
    #: value class -> isinstance verdict, for typed values (each state class has its own dict)
    _verdicts: dict[type, bool]

    def __instancecheck__(cls, obj: object) -> bool:
        tp = type(obj)
        if tp is cls:
            return True
        # a typed value of another state class (an Invariant value against Varying["dp"]): the
        # verdict depends on the two classes only, one dict lookup after the first check
        verdicts = cls._verdicts
        verdict = verdicts.get(tp)
        if verdict is not None:
            return verdict
        if isinstance(tp, _StateMeta):
            t = tp._spmd_type
            want = cls._spmd_type
            verdict = t is not None and (want is None or t is want or _accepts(want, t))
            verdicts[tp] = verdict
            return verdict
        # a raw JAX value: its state is read from JAX each time (never cached)
        t = _raw_typeof(obj)
        if t is None:
            return False
        want = cls._spmd_type
        if want is None or t is want:
            return True
        return _accepts(want, t)

    def __subclasscheck__(cls, sub: type) -> bool:
        if sub is cls:
            return True
        want, have = cls._spmd_type, getattr(sub, "_spmd_type", None)
        if not isinstance(sub, _StateMeta):
            return type.__subclasscheck__(cls, sub)
        if want is None:
            return True
        return have is not None and _accepts(want, have)

    def __instancecheck_str__(cls, obj: object) -> str:
        """beartype's hook: why `obj` is not an instance (lowercase clause, no period)."""
        want = cls._spmd_type
        t = spmd_type_of(obj)
        if t is None:
            return (f"{type(obj).__name__} is not a typed spmdtyped value nor a JAX value inside "
                    f"shard_map")
        if want is None:
            return "this value is accepted"
        return describe_mismatch(want, t)


def _accepts(want: SpmdType, have: SpmdType) -> bool:
    """`have` fits hint `want`: Varying is covariant (Invariant <: Varying), U and R exact."""
    return (have.varying <= want.varying and have.unreduced == want.unreduced
            and have.reduced == want.reduced
            and (have.kind == want.kind or not have.unreduced))


def describe_mismatch(want: SpmdType, have: SpmdType) -> str:
    for a in sorted(have.axes | want.axes):
        hs, ws = have.state(a), want.state(a)
        if hs != ws and not (hs.value == "invariant" and ws.value == "varying"):
            return f"this value is {hs.value} over {a!r}, but the hint wants {ws.value}"
    return f"this value is {have}, but the hint wants {want}"


class SArray(metaclass=_StateMeta):
    """A typed value: a JAX array (or tracer) with its manual-axis state.

    Its concrete class is its state class (`type(x) is st.Varying["dp"]`). Statically it is the
    generic `SArray[V, U, R]` (see `spmdtyped._static`). `x.raw` is the JAX value; `x.spmd_type`
    its `SpmdType`; `x.shape`, `x.dtype`, `x.ndim` are the local (per-device) ones.
    """

    __slots__ = ("raw",)
    _spmd_type: SpmdType | None = None
    _verdicts: dict[type, bool] = {}  # noqa: RUF012 - the metaclass's per-class cache

    def __init__(self, raw: Any) -> None:  # noqa: D107
        if type(self)._spmd_type is None:
            raise error("SPMD504", "SArray() needs a state: use st.wrap(x), or "
                        "st.Varying['dp'](x) with an explicit state")
        self.raw = raw

    def __class_getitem__(cls, params: Any) -> type[SArray]:
        if cls is not SArray:
            raise error("SPMD504", f"{cls.__qualname__} is already a state; it takes no subscript")
        if not isinstance(params, tuple) or len(params) != 3:
            raise error("SPMD504", "SArray[V, U, R] takes three axis sets (Literal[...] or Never)")
        sets = [frozenset(_literal_axes(p, "SArray")) for p in params]
        return state_class(SpmdType(*sets))

    @property
    def spmd_type(self) -> SpmdType:
        return type(self)._spmd_type  # type: ignore[return-value]

    def __repr__(self) -> str:
        try:
            inner = repr(self.raw)
        except Exception:  # a leaked tracer's repr raises; show what is known
            inner = f"<{type(self.raw).__name__} {getattr(self.raw, 'shape', '?')}>"
        return f"{type(self).__qualname__}({inner})"

    # Operators and array methods live in _array (they need JAX).
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _ops().getattr_(self, name)


_OPS: Any = None


def _ops() -> Any:
    global _OPS
    if _OPS is None:
        from . import _array

        _OPS = _array
    return _OPS


def _binop(name: str, reflected: bool = False) -> Callable[[SArray, Any], Any]:
    def method(self: SArray, other: Any) -> Any:
        return _ops().binary(name, other, self) if reflected else _ops().binary(name, self, other)

    method.__name__ = f"__{'r' if reflected else ''}{name}__"
    return method


for _n, _m in (("add", "add"), ("sub", "sub"), ("mul", "mul"), ("truediv", "div"),
               ("matmul", "matmul"), ("pow", "pow")):
    setattr(SArray, f"__{_n}__", _binop(_m))
    setattr(SArray, f"__r{_n}__", _binop(_m, reflected=True))
for _n, _m in (("and", "and"), ("or", "or"), ("xor", "xor"), ("mod", "mod"),
               ("floordiv", "floordiv")):
    setattr(SArray, f"__{_n}__", _binop(_m))
    setattr(SArray, f"__r{_n}__", _binop(_m, reflected=True))
for _n, _m in (("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge"), ("eq", "eq"), ("ne", "ne")):
    setattr(SArray, f"__{_n}__", _binop(_m))
# elementwise == makes typed values unhashable, like JAX arrays
SArray.__hash__ = None  # type: ignore[assignment]
SArray.__invert__ = lambda self: _ops().unary_op("logical_not", self)  # type: ignore[attr-defined]
SArray.__neg__ = lambda self: _ops().unary_op("neg", self)  # type: ignore[attr-defined]
SArray.__pos__ = lambda self: self  # type: ignore[attr-defined]
SArray.__getitem__ = lambda self, idx: _ops().getitem(self, idx)  # type: ignore[attr-defined]
SArray.__abs__ = lambda self: _ops().unary_op("abs", self)  # type: ignore[attr-defined]
SArray.__len__ = lambda self: len(self.raw)  # type: ignore[attr-defined]


@functools.cache
def state_class(t: SpmdType) -> type[SArray]:
    """The one class of state `t` (cached: `state_class(t) is state_class(t)`)."""
    name = str(t)
    cls = _StateMeta(name, (SArray,), {"__slots__": (), "_spmd_type": t, "_verdicts": {}, "__module__": "spmdtyped",
                                       "__qualname__": name, "__doc__": f"Typed values in state {name}."})
    _made.append(cls)
    for hook in _class_hooks:
        hook(cls)
    return cls  # type: ignore[return-value]


def _literal_axes(p: Any, family: str) -> list[str]:
    """Axis names from one subscript argument (a str, "a | b", Literal[...], Never)."""
    if isinstance(p, str):
        names = [s.strip() for s in p.split("|")] if "|" in p else [p]
        for n in names:
            if not _AXIS_RE.match(n):
                raise error("SPMD504", f"{family}[{p!r}]: {n!r} is not an axis name")
        return names
    origin = typing.get_origin(p)
    if origin is typing.Literal:
        out: list[str] = []
        for a in typing.get_args(p):
            out.extend(_literal_axes(a, family))
        return out
    if origin is typing.Union:
        out = []
        for a in typing.get_args(p):
            out.extend(_literal_axes(a, family))
        return out
    if p is typing.NoReturn or getattr(typing, "Never", None) is p or repr(p).endswith("Never"):
        return []
    raise error("SPMD504", f"{family}[...]: {p!r} is not an axis name (use a str or Literal[...])")


class _FamilyMeta(_StateMeta):
    """`Varying`, `Unreduced`, `Reduced`, `Typed`: subscript to get a state class."""

    _family: str

    def __getitem__(cls, params: Any) -> type[SArray]:
        return _subscript(cls._family, params)


@functools.lru_cache(maxsize=1024)
def _subscript(family: str, params: Any) -> type[SArray]:
    if not isinstance(params, tuple):
        params = (params,)
    if not params:
        raise error("SPMD504", f"{family}[] needs at least one axis")
    axes: list[str] = []
    nested: list[SpmdType] = []
    for p in params:
        if isinstance(p, _StateMeta) and p._spmd_type is not None:
            nested.append(p._spmd_type)
        elif isinstance(p, typing.TypeVar):
            return SArray if family != "Typed" else SArray
        else:
            if family == "Typed":
                raise error("SPMD504", f"Typed[...] takes states such as Varying['dp'], got {p!r}")
            axes.extend(_literal_axes(p, family))
    dup = sorted({a for a in axes if axes.count(a) > 1})
    if dup:
        raise error("SPMD504", f"{family}[...]: axis {dup[0]!r} is named twice", axes=dup)
    if family != "Typed" and not axes and not nested:
        raise error("SPMD504", f"{family}[...] needs at least one axis")
    v: set[str] = set()
    u: set[str] = set()
    r: set[str] = set()
    kind = None
    seen: dict[str, str] = {}
    parts = [SpmdType(**{family.lower(): axes})] if family != "Typed" else []
    for t in parts + nested:
        for a in t.axes:
            s = t.state(a).value
            if a in seen and seen[a] != s:
                raise error("SPMD504", f"{family}[...]: axis {a!r} is given two states "
                            f"({seen[a]} and {s})", axes=(a,), states={a: s})
            seen[a] = s
        v |= t.varying
        u |= t.unreduced
        r |= t.reduced
        kind = kind or t.unreduced_kind
    return state_class(SpmdType(v, u, r, kind))


def _family(name: str, doc: str) -> type[SArray]:
    cls = _FamilyMeta(name, (SArray,), {"__slots__": (), "_spmd_type": None, "_family": name,
                                        "_verdicts": {}, "__module__": "spmdtyped",
                                        "__doc__": doc})
    return cls  # type: ignore[return-value]


Varying = _family("Varying", "Varying on the named axes: `Varying['dp']`, `Varying['dp', 'tp']`.")
Unreduced = _family("Unreduced", "Unreduced (pending sum) on the named axes: `Unreduced['tp']`.")
Reduced = _family("Reduced", "Reduced (replicated; cotangent Unreduced) on the named axes: `Reduced['tp']`.")
Typed = _family("Typed", "Mixed states: `Typed[Varying['dp'], Reduced['tp']]`.")
Invariant = state_class(INVARIANT)


def hint_type(hint: Any) -> SpmdType | None:
    """The SpmdType a hint class stands for (None for SArray / unsubscripted families)."""
    return getattr(hint, "_spmd_type", None) if isinstance(hint, _StateMeta) else None
