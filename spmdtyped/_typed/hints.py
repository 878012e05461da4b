"""Runtime hint objects: `Varying["dp"]`, `Reduced["tp"]`, `Unreduced["tp"]`, `Invariant`, `Typed[...]`.

Each state (an `SpmdType`) has exactly one cached class, and every typed value's concrete
class *is* its state class, so an exact `isinstance`/beartype check is one class test
(CPython short-circuits `type(obj) is cls`). The metaclass `__instancecheck__` only runs for
the covariant case (a value less varying than the hint; its verdict is cached per pair of
classes, one dict lookup) and for raw JAX values inside shard_map, whose state is read from
JAX each time.

Imports no JAX, and nothing above it: the operator dunders are generated from the surface
table (`_surface.OPERATORS`) and call the operations the JAX layer registers
(`register_operations`, called by `_typed.attributes` on import); raw JAX values are read by the
function `_compat` registers (`register_raw_typeof`). When a typed value is used before the
JAX layer was imported (`st.Varying["dp"](x) + 1` with nothing else loaded), the layer is
loaded by name, and registers itself.
"""

from __future__ import annotations

import copyreg
import dataclasses
import functools
import importlib
import operator
import re
import sys
import typing
from collections.abc import Callable
from typing import Any

from .. import _surface
from .._errors import error
from .._rules import INVARIANT, SpmdType
from .._rules.refine import NONE as NO_REFINEMENT
from .._rules.refine import Refinement, describe
from .._rules.refine import shape as refine_shape

_AXIS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")

#: called with each new state class (``_array`` registers them as pytrees)
_class_hooks: list[Callable[[type], None]] = []
#: every state class made so far
_made: list[type] = []


def on_state_class(hook: Callable[[type], None]) -> None:
    """Call `hook` with every state class made so far and with each one made later."""
    for cls in list(_made):
        hook(cls)
    _class_hooks.append(hook)


@dataclasses.dataclass(frozen=True)
class Operations:
    """What the operator dunders and attribute access of typed values call (the JAX layer).

    - `binary(rule, a, b, *, op, bind)`: a binary operator (`_array.binary`);
    - `unary(rule, x, bind, *, op)`: a unary operator (`_array.unary_op`);
    - `getitem(x, idx)`, `getattr(x, name)`: indexing and methods/properties;
    - `jax_attribute(x, name)`: an attribute of `jax.Array` that JAX's own code reads of a
      typed value (`x.sharding` in `lax.full_like`), read as JAX reads it of the raw value.
    """

    binary: Callable[..., Any]
    unary: Callable[..., Any]
    getitem: Callable[[Any, Any], Any]
    getattr: Callable[[Any, str], Any]
    jax_attribute: Callable[[Any, str], Any]


_OPERATIONS: list[Operations] = []
#: the JAX layer: importing it registers the operations (and, through `_compat`, the
#: raw-value reader)
_JAX_LAYER = __name__.rpartition(".")[0] + ".attributes"


def register_operations(ops: Operations) -> None:
    """Called once by the JAX layer (`_typed.attributes`) on import."""
    _OPERATIONS[:] = [ops]


def _ops() -> Operations:
    if not _OPERATIONS:
        importlib.import_module(_JAX_LAYER)
    return _OPERATIONS[0]


#: `_compat.typeof_raw_or_none`, registered by `_compat` on import
_typeof_raw_or_none: Callable[[object], SpmdType | None] | None = None


def register_raw_typeof(fn: Callable[[object], SpmdType | None]) -> None:
    """Called once by `_compat` on import: how to read the state of a raw JAX value."""
    global _typeof_raw_or_none
    _typeof_raw_or_none = fn


def _raw_typeof(obj: object) -> SpmdType | None:
    """The state of a raw JAX value (None when `obj` is not one, or JAX is not in use)."""
    if _typeof_raw_or_none is None:
        if "jax" not in sys.modules:
            return None
        importlib.import_module(_JAX_LAYER)
    assert _typeof_raw_or_none is not None
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

    # __weakref__: weakref.ref(x) works, as on jax.Array (caches keyed weakly on values)
    __slots__ = ("raw", "refinement", "__weakref__")
    _spmd_type: SpmdType | None = None
    _verdicts: dict[type, bool] = {}  # noqa: RUF012 - the metaclass's per-class cache

    def __init__(self, raw: Any) -> None:  # noqa: D107
        if type(self)._spmd_type is None:
            raise error("SPMD504", "SArray() needs a state: use st.wrap(x), or "
                        "st.Varying['dp'](x) with an explicit state")
        self.raw = raw
        self.refinement = NO_REFINEMENT

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

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle / copy: the class by its state (see `_reduce_class`), the value, the refinement
        return (_rebuild, (type(self), self.raw, self.refinement))

    def __repr__(self) -> str:
        try:
            inner = repr(self.raw)
        except Exception:  # a leaked tracer's repr raises; show what is known
            inner = f"<{type(self.raw).__name__} {getattr(self.raw, 'shape', '?')}>"
        ref = getattr(self, "refinement", NO_REFINEMENT)
        name = describe(type(self)._spmd_type, ref) if ref else type(self).__qualname__  # type: ignore[arg-type]
        return f"{name}({inner})"

    # Operators live in `_typed.array`, array methods in `_typed.attributes` (they need JAX).
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if _by_jax() and _is_array_method(name):  # `x_dot.sum(axis)` in a JAX custom_jvp rule
            return _ops().jax_attribute(self, name)
        return _ops().getattr(self, name)


def _operand(other: Any) -> bool:
    """Whether `other` can be the other operand of an operator: a typed value, a number, an
    array (JAX, NumPy) or an object with `__jax_array__`. Anything else (None, a str, a list)
    gets NotImplemented, as from `jax.Array`: `x == None` is False, `x + "a"` Python's
    TypeError."""
    tp = type(other)
    if isinstance(tp, _StateMeta) or tp in _NUMBERS:  # the common operands, at no cost
        return True
    return isinstance(other, (SArray, int, float, complex)) or hasattr(other, "__jax_array__") \
        or (hasattr(other, "dtype") and hasattr(other, "shape"))


_NUMBERS = frozenset({int, float, complex, bool})


def _python_operator(name: str) -> Callable[..., Any]:
    """`operator.mul` for `__mul__`, `operator.and_` for `__and__`."""
    n = name.strip("_")
    return getattr(operator, n, None) or getattr(operator, n + "_")  # type: ignore[no-any-return]


def _by_jax(depth: int = 2) -> bool:
    """Whether JAX's own code applied the operator (the frame `depth` up): a custom_jvp rule
    such as `jax.nn.softmax`'s (on by default in jax 0.12.1) gets typed values and typed
    tangents, and must return a primal and a tangent of the same pytree structure. Its
    `jnp` calls give raw values (`__jax_array__`), so its operators must too."""
    return sys._getframe(depth).f_globals.get("__name__", "").startswith("jax.")


@functools.cache
def _is_array_method(name: str) -> bool:
    """Whether `jax.Array` has the public method or property `name` (`sum`, `astype`, `T`)."""
    import jax

    return not name.startswith("_") and hasattr(jax.Array, name)


def _jax_value(x: Any) -> Any:
    """A typed value as JAX's own functions see it (`__jax_array__`, with its refusals)."""
    return x.__jax_array__() if isinstance(type(x), _StateMeta) else x


def _binop(row: _surface.Row, reflected: bool) -> Callable[[SArray, Any], Any]:
    rule, op, pyop = row.rule, f"operator {row.symbol}", _python_operator(row.name)

    if reflected:
        def method(self: SArray, other: Any) -> Any:
            if not _operand(other):
                return NotImplemented
            if _by_jax():
                return pyop(_jax_value(other), _jax_value(self))
            return _ops().binary(rule, other, self, op=op)
    else:
        def method(self: SArray, other: Any) -> Any:
            if not _operand(other):
                return NotImplemented
            if _by_jax():
                return pyop(_jax_value(self), _jax_value(other))
            return _ops().binary(rule, self, other, op=op)

    method.__name__ = method.__qualname__ = row.reflected if reflected else row.name  # type: ignore[assignment]
    return method


def _unop(row: _surface.Row) -> Callable[[SArray], Any]:
    rule, pyop = row.rule, _python_operator(row.name)

    def method(self: SArray) -> Any:
        if _by_jax():
            return pyop(_jax_value(self))
        return _ops().unary(rule, self, op=rule)

    method.__name__ = method.__qualname__ = row.name
    return method


# the operators of the surface table, every one (tests/test_surface.py checks each)
for _row in _surface.OPERATORS:
    setattr(SArray, _row.name, _binop(_row, reflected=False))
    if _row.reflected:
        setattr(SArray, _row.reflected, _binop(_row, reflected=True))
for _row in _surface.UNARY_OPERATORS:
    setattr(SArray, _row.name, _unop(_row))
# elementwise == makes typed values unhashable, like JAX arrays
SArray.__hash__ = None  # type: ignore[assignment]
SArray.__getitem__ = lambda self, idx: _ops().getitem(self, idx)  # type: ignore[attr-defined]
SArray.__len__ = lambda self: len(self.raw)  # type: ignore[attr-defined]


def is_state_class(tp: object) -> bool:
    """Whether `tp` is a state class (the class of a typed value, or a hint family)."""
    return isinstance(tp, _StateMeta)


#: the metaclass of the state classes: `isinstance(tp, STATE_META)` is `is_state_class(tp)`
#: without the call (the typed values' per-op path, `_typed.memo`, `_typed.array.binary`)
STATE_META: type = _StateMeta


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
    refined: list[Refinement] = []
    for p in params:
        if isinstance(p, _StateMeta) and p._spmd_type is not None:
            nested.append(p._spmd_type)
            if isinstance(p, _RefinedMeta):
                refined.append(p._refinement)
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
    if refined:
        items = {a: k for ref in refined for a, k in ref.items}
        return refined_class(SpmdType(v, u, r, kind), Refinement.of(items))
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


# ------------------------------------------------------------------------------ refinements


class _RefinedMeta(_StateMeta):
    """A hint that names how a Varying value varies (DESIGN.md §1b): `Shard["tp", -1]`,
    `Partial["tp"]`, `Rep["tp"]`, or a `Typed[...]` mixing them with the four states.

    A typed value's class is its four-state class; its refinement is per instance. So the
    check is the four-state check (cached per pair of classes, as for every hint) and then the
    refinement, per value, with `refine_shape.accepts`: gradual, a plain Varying value (not
    followed) is accepted, an Invariant one and one of another kind are refused. A Shard dim
    counted from the left (`Shard["tp", 0]`) is resolved against the value's rank.
    """

    _refinement: Refinement
    _base: _StateMeta

    def __instancecheck__(cls, obj: object) -> bool:
        if not _StateMeta.__instancecheck__(cls._base, obj):
            return False
        return _refinement_reason(cls, obj) is None

    def __instancecheck_str__(cls, obj: object) -> str:
        t = spmd_type_of(obj)
        if t is None or not _StateMeta.__instancecheck__(cls._base, obj):
            return _StateMeta.__instancecheck_str__(cls._base, obj)
        return _refinement_reason(cls, obj) or "this value is accepted"


def refinement_mismatch(hint: Any, obj: object) -> str | None:
    """Why `obj`'s refinement does not fit a refined hint (`Shard[...]`, `Partial[...]`, ...),
    else None (None too for a hint that names no refinement)."""
    if not isinstance(hint, _RefinedMeta) or spmd_type_of(obj) is None:
        return None
    return _refinement_reason(hint, obj)


def _refinement_reason(cls: _RefinedMeta, obj: object) -> str | None:
    t = spmd_type_of(obj)
    assert t is not None
    have = getattr(obj, "refinement", NO_REFINEMENT) if isinstance(type(obj), _StateMeta) \
        else NO_REFINEMENT
    shape = getattr(getattr(obj, "raw", obj), "shape", None)
    return refine_shape.accepts(cls._refinement, have, t,
                                ndim=len(shape) if shape is not None else None)


@functools.cache
def refined_class(t: SpmdType, ref: Refinement) -> type[SArray]:
    """The hint class of state `t` refined by `ref` (cached). Never the class of a value."""
    name = describe(t, ref)
    cls = _RefinedMeta(name, (SArray,), {"__slots__": (), "_spmd_type": t, "_verdicts": {},
                                         "_refinement": ref, "_base": state_class(t),
                                         "__module__": "spmdtyped", "__qualname__": name,
                                         "__doc__": f"Typed values that are {name}."})
    return cls  # type: ignore[return-value]


def _dim(p: Any) -> int:
    if typing.get_origin(p) is typing.Literal and len(typing.get_args(p)) == 1:
        p = typing.get_args(p)[0]
    if isinstance(p, int) and not isinstance(p, bool):
        return p
    raise error("SPMD504", f"Shard[axis, dim]: the dim must be an int (negative: from the right), "
                f"got {p!r}")


class _RefineFamilyMeta(_StateMeta):
    """`Shard`, `Partial`, `Rep`: subscript to get a refined hint class."""

    _family: str

    def __getitem__(cls, params: Any) -> type[SArray]:
        return _refined_subscript(cls._family, params if isinstance(params, tuple) else (params,))


@functools.lru_cache(maxsize=1024)
def _refined_subscript(family: str, params: tuple[Any, ...]) -> type[SArray]:
    if family == "Shard":
        if len(params) != 2:
            raise error("SPMD504", f"Shard[axis, dim] takes an axis and a dim, got {len(params)} "
                        f"arguments (mix axes with Typed[Shard['dp', 0], Shard['tp', 1]])")
        (axis,) = _literal_axes(params[0], family)
        ref = refine_shape.hint_refinement({axis: _dim(params[1])})
        axes = [axis]
    else:
        axes = [a for p in params for a in _literal_axes(p, family)]
        if not axes:
            raise error("SPMD504", f"{family}[...] needs at least one axis")
        dup = sorted({a for a in axes if axes.count(a) > 1})
        if dup:
            raise error("SPMD504", f"{family}[...]: axis {dup[0]!r} is named twice", axes=dup)
        ref = (refine_shape.hint_refinement({}, partial=axes) if family == "Partial"
               else refine_shape.hint_refinement({}, rep=axes))
    return refined_class(SpmdType(varying=axes), ref)


def _refine_family(name: str, doc: str) -> type[SArray]:
    cls = _RefineFamilyMeta(name, (SArray,), {"__slots__": (), "_spmd_type": None,
                                              "_family": name, "_verdicts": {},
                                              "__module__": "spmdtyped", "__doc__": doc})
    return cls  # type: ignore[return-value]


Shard = _refine_family("Shard", "A shard of a global array: `Shard['tp', -1]` is Varying over "
                       "'tp', the device's slice along the last dim.")
Partial = _refine_family("Partial", "Partial sums: `Partial['tp']` is Varying over 'tp', one "
                         "device's term of a sum over 'tp' (the true value is the psum).")
Rep = _refine_family("Rep", "Replicated but typed Varying: `Rep['tp']` is equal on every device "
                     "of 'tp' (a pvary of an Invariant value).")


# ------------------------------------------------------------------------------ pickling
# The state and hint classes are made at run time, so pickle cannot find them by their names
# (`spmdtyped.Varying['dp']` is no attribute). Each is pickled as the call that makes it again:
# by its state (and refinement), or by its family name.


def _rebuild(cls: type, raw: Any, refinement: Refinement) -> Any:
    obj: Any = object.__new__(cls)
    obj.raw = raw
    obj.refinement = refinement
    return obj


def _family_named(name: str) -> Any:
    return globals()[name]


def _reduce_class(cls: Any) -> Any:
    if cls is SArray or cls._spmd_type is None:  # SArray, Varying, Typed, Shard, ...
        return (_family_named, (cls.__name__,))
    if isinstance(cls, _RefinedMeta):
        return (refined_class, (cls._spmd_type, cls._refinement))
    return (state_class, (cls._spmd_type,))


for _meta in (_StateMeta, _FamilyMeta, _RefinedMeta, _RefineFamilyMeta):
    copyreg.pickle(_meta, _reduce_class)
