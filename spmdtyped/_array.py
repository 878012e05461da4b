"""Typed values: operators and array methods, each typed through `_rules`, bound through JAX.

A typed value is an instance of its state class (`_hints.state_class`), holding the JAX value
in `.raw`. Every state class is a registered pytree (one child: the raw value; the state is
the class itself), so typed values pass through `jax.jit`, `jax.tree_util` and friends.
"""

from __future__ import annotations

import builtins
import contextlib
import operator
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from . import _compat, _hints, _protocols, _rules, _surface
from ._errors import error
from ._hints import SArray, is_state_class, state_class
from ._rules import LITERAL, Operand, SpmdType

# ------------------------------------------------------------------- pytree registration


def _register(cls: type) -> None:
    jax.tree_util.register_pytree_node(
        cls,
        lambda x: ((x.raw,), None),
        lambda _aux, children, cls=cls: _unflatten(cls, children[0]),
    )


def _new(cls: type, raw: Any) -> Any:
    obj = object.__new__(cls)
    obj.raw = raw
    return obj


def _unflatten(cls: type, raw: Any) -> Any:
    if is_state_class(type(raw)):
        # a tree_map whose function returned a typed value (`p - lr * g` with a typed `lr`):
        # that value is the node, typed by the rules, never a typed value inside a typed value
        return raw
    # jax.grad / jax.vjp rebuild the *primal's* class around each cotangent, but a cotangent's
    # state differs (Reduced <-> Unreduced, reference §5): inside a checking shard_map, a JAX
    # value whose state disagrees with the class gets the class of its own state.
    t = _compat.typeof_raw_or_none(raw)
    if t is not None and t != cls._spmd_type and _compat.current_mesh()[1] \
            and _compat.check_vma_enabled():
        cls = state_class(t)
    return _new(cls, raw)


# classes made before this module was imported (Invariant, hints used in annotations), then
# every later one
_hints.on_state_class(_register)

# ------------------------------------------------------------------- check mode

_CHECK = [True]


def set_check_mode(on: bool) -> None:
    """Turn the comparison of every predicted state with JAX's own on (default) or off.

    Check mode costs one `jax.typeof` per op at trace time and nothing in the compiled program.
    """
    _CHECK[0] = bool(on)


@contextlib.contextmanager
def check_mode(on: bool) -> Iterator[None]:
    old = _CHECK[0]
    _CHECK[0] = bool(on)
    try:
        yield
    finally:
        _CHECK[0] = old


def checked(op: str, out: Any, predicted: SpmdType) -> Any:
    """Compare JAX's state of `out` with the table's prediction (SPMD901), then wrap."""
    cls = state_class(predicted)
    if _CHECK[0] and not in_vma_off():
        actual = _compat.typeof_raw(out)
        # `actual` is a state class's own SpmdType (see _compat.mat_to_spmd): identity first
        if actual is not cls._spmd_type and actual != predicted:
            raise error("SPMD901", f"{op}: the rule table predicted {predicted}, JAX computed "
                        f"{actual} ({_compat.FEATURES.name})", op=op,
                        details=(f"jax {jax.__version__}",))
    return _new(cls, out)


_VMA_OFF = [0]


def in_vma_off() -> bool:
    """Inside an `st.shard_map(..., check_vma=False)` body: JAX types every value Invariant,
    so spmdtyped tracks the states itself and skips the comparison with JAX."""
    return _VMA_OFF[0] > 0


@contextlib.contextmanager
def vma_off() -> Iterator[None]:
    _VMA_OFF[0] += 1
    try:
        yield
    finally:
        _VMA_OFF[0] -= 1


# ------------------------------------------------------------------- state of anything


def wrap(raw: Any, spmd_type: SpmdType | None = None) -> Any:
    """A typed value for a raw JAX value; the state is read from JAX unless given.

    **Arguments:**

    - `raw`: a JAX array or tracer (inside shard_map), or a typed value (returned as is).
    - `spmd_type`: the state to record instead of JAX's (must then agree in check mode).

    **Returns:** an instance of the state class, e.g. `st.Varying["dp"]`.
    """
    if _is_container(raw):  # a pytree (tuple, eqx.Module, nnx state, dataclass): every leaf
        return jax.tree_util.tree_map(lambda r: wrap(r, spmd_type), raw, is_leaf=is_typed)
    if is_state_class(type(raw)):
        if spmd_type is not None and spmd_type != raw.spmd_type:
            raise error("SPMD504", f"st.wrap: value is already typed {raw.spmd_type}, not {spmd_type}")
        return raw
    if spmd_type is None:
        spmd_type = _compat.typeof_raw(raw)
    return _new(state_class(spmd_type), raw)


def unwrap(x: Any) -> Any:
    """The JAX value of a typed value (`x.raw`); anything else is returned unchanged. Pytrees too."""
    if is_state_class(type(x)):
        return x.raw
    if _is_container(x):  # any pytree: eqx.Module, flax nnx state, registered dataclasses, ...
        return jax.tree_util.tree_map(unwrap, x, is_leaf=is_typed)
    return x


def _is_container(x: Any) -> bool:
    """A pytree node (not a leaf, not a typed value): wrap/unwrap descend into it."""
    if is_state_class(type(x)) or isinstance(x, (jax.Array, np.ndarray, np.generic)):
        return False
    return not jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(x, is_leaf=is_typed)) \
        or isinstance(x, (list, tuple, dict))


def is_typed(x: Any) -> bool:
    return is_state_class(type(x))


def typeof(x: Any) -> SpmdType:
    """The manual-axis state of a typed value, or of a raw JAX value/tracer inside shard_map.

    Equal to JAX's `jax.typeof(raw).manual_axis_type` for the same value.
    """
    if is_typed(x):
        return type(x)._spmd_type  # type: ignore[no-any-return]
    if isinstance(x, (int, float, complex, bool, np.ndarray, np.generic)):
        return _rules.INVARIANT
    try:
        return _compat.typeof_raw(x)
    except TypeError:
        raise error("SPMD504", f"st.typeof: {type(x).__name__} is not a JAX value") from None


def operand(x: Any) -> tuple[Any, Operand]:
    """(raw value, type or LITERAL) of an operand."""
    if is_typed(x):
        return x.raw, type(x)._spmd_type
    if isinstance(x, (int, float, complex)) and not isinstance(x, bool) or isinstance(x, bool):
        return x, LITERAL
    if isinstance(x, (np.ndarray, np.generic)):
        return x, _rules.INVARIANT
    return x, _compat.typeof_raw(x)


# ------------------------------------------------------------------- operators

def _resolve(dotted: str) -> Callable[..., Any]:
    """`operator.mod` / `builtins.abs` (a surface row's `jax` binding) -> the function."""
    module, _, name = dotted.partition(".")
    return getattr({"operator": operator, "builtins": builtins}[module], name)  # type: ignore[no-any-return]


#: operator rule -> its symbol and Python function, from the surface table
_SYMBOL = {r.rule: r.symbol for r in _surface.OPERATORS}
_BIND: dict[str, Callable[..., Any]] = {r.rule: _resolve(r.jax) for r in _surface.OPERATORS}  # type: ignore[misc]
_UNARY_BIND: dict[str, Callable[..., Any]] = {r.rule: _resolve(r.jax)  # type: ignore[misc]
                                              for r in _surface.UNARY_OPERATORS}


def _cast_literal(c: Any, like: Any, axes: frozenset[str]) -> Any:
    return _compat.pcast(_compat.asarray_like(c, like), tuple(sorted(axes)), to="reduced")


def binary(name: str, a: Any, b: Any, *, op: str | None = None,
           bind: Callable[[Any, Any], Any] | None = None) -> Any:
    """`a <name> b` for typed or raw operands (at least one typed)."""
    ra, ta = operand(a)
    rb, tb = operand(b)
    op = op or f"operator {_SYMBOL.get(name, name)}"
    bind = bind or _BIND[name]
    res = _rules.binary(name, ta, tb, _compat.FEATURES, op=op,
                        int_literal=tb is LITERAL and isinstance(rb, int) and not isinstance(rb, bool))
    if res.bind == "integer_pow":
        return checked(op, ra ** rb, res.type)
    if res.bind == "mul_reciprocal":
        rb, bind = 1.0 / rb, operator.mul
    if res.literal_reduced:
        if ta is LITERAL:
            ra = _cast_literal(ra, rb, res.literal_reduced)
        if tb is LITERAL:
            rb = _cast_literal(rb, ra, res.literal_reduced)
    return checked(op, bind(ra, rb), res.type)


def nary(rule: str | Callable[[list[Operand]], _rules.Combined], args: list[Any],
         bind: Callable[..., Any], *, op: str) -> Any:
    """An n-operand op (where, concatenate, einsum, ...) typed by `combine` of rule `rule`, or
    by `rule(types)` when it is a function of the operand types (`_rules.where_type`)."""
    raws, types = zip(*(operand(a) for a in args), strict=True) if args else ((), ())
    raws = list(raws)
    res = (_rules.combine(rule, list(types), _compat.FEATURES, op=op) if isinstance(rule, str)
           else rule(list(types)))
    if res.literal_reduced:
        like = next(r for r, t in zip(raws, types, strict=True) if t is not LITERAL)
        raws = [_cast_literal(r, like, res.literal_reduced) if t is LITERAL else r
                for r, t in zip(raws, types, strict=True)]
    return checked(op, bind(*raws), res.type)


def unary_op(name: str, x: Any, bind: Callable[[Any], Any] | None = None, *, op: str | None = None) -> Any:
    raw, t = operand(x)
    op = op or name
    if bind is None:
        bind = _UNARY_BIND[name]
    if t is LITERAL:
        t = _rules.INVARIANT
    out_t = _rules.unary(name, t, _compat.FEATURES, op=op)  # type: ignore[arg-type]
    return checked(op, bind(raw), out_t)


_STATIC_INDEX = str(_surface.STATIC_INDEX.rule)


def _is_dynamic_index(idx: Any) -> bool:
    items = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(i, (jax.Array, jax.core.Tracer)) or is_typed(i) for i in items)


def getitem(x: SArray, idx: Any) -> Any:
    if _is_dynamic_index(idx):
        items = idx if isinstance(idx, tuple) else (idx,)
        idx_types = [typeof(i) for i in items
                     if is_typed(i) or isinstance(i, (jax.Array, jax.core.Tracer))]
        idx = unwrap(idx)
        raw, t = operand(x)
        out_t = _rules.dynamic_index_type(t, idx_types, _compat.FEATURES, op="indexing")  # type: ignore[arg-type]
        return checked("indexing", raw[idx], out_t)
    return unary_op(_STATIC_INDEX, x, lambda r: r[idx], op="indexing")


def mean(x: Any, axis: Any = None, *, keepdims: bool = False, op: str = ".mean()") -> Any:
    """Mean over local dimensions: jnp.mean for Invariant/Varying values (identical program);
    sum then a literal-cast division for Unreduced/Reduced ones (JAX rejects those)."""
    raw, t = operand(x)
    assert isinstance(t, SpmdType)
    if not (t.unreduced or t.reduced):
        return checked(op, jnp.mean(raw, axis=axis, keepdims=keepdims),
                       _rules.mean_type(t, _compat.FEATURES, op=op))
    total = unary_op("sum", x, lambda r: jnp.sum(r, axis=axis, keepdims=keepdims), op=op)
    n = int(np.prod([raw.shape[a] for a in ((axis,) if isinstance(axis, int) else (axis or range(raw.ndim)))]))
    return binary("div", total, float(n), op=op)


def getattr_(x: SArray, name: str) -> Any:
    """`x.<name>`: a method or property of the surface table (`_surface.METHODS`,
    `_surface.PROPERTIES`), or `x.at`."""
    row = _surface.by_attribute(name)
    if row is None:
        if name == "at":
            return _At(x)
        raise AttributeError(f"{type(x).__qualname__} has no attribute {name!r} (typed values "
                             f"expose {', '.join(_ATTRIBUTES)}, at[] and operators; use x.raw "
                             f"for the JAX value)")
    rule = row.rule
    if rule is None:
        return getattr(x.raw, name)
    if row.kind == "property":
        return unary_op(rule, x, lambda r: getattr(r, name), op=f".{name}")
    if row.binding == "mean":
        return lambda axis=None, keepdims=False: mean(x, axis, keepdims=keepdims)
    return lambda *args, **kw: unary_op(rule, x, lambda r: getattr(r, name)(*args, **kw),
                                        op=f".{name}()")


_ATTRIBUTES = tuple(r.name for r in (*_surface.PROPERTIES, *_surface.METHODS))


class _At:
    """`x.at[idx].set(v)` / `.add(v)` / ...: typed like JAX's scatter, strict on Unreduced."""

    def __init__(self, x: SArray) -> None:
        self.x = x

    def __getitem__(self, idx: Any) -> _AtIndex:
        return _AtIndex(self.x, idx)


class _AtIndex:
    """`x.at[idx]`: one method per `_surface.AT` row (`_rules.at_update_type` types it)."""

    def __init__(self, x: SArray, idx: Any) -> None:
        self.x, self.idx = x, unwrap(idx)

    def _update(self, method: str, value: Any, **kw: Any) -> Any:
        raw_v, tv = operand(value)
        op = f".at[].{method}()"
        out_t = _rules.at_update_type(method, typeof(self.x), tv, _compat.FEATURES, op=op)
        out = getattr(self.x.raw.at[self.idx], method)(raw_v, **kw)
        return checked(op, out, out_t)


def _at_method(method: str) -> Callable[..., Any]:
    def update(self: _AtIndex, value: Any, **kw: Any) -> Any:
        return self._update(method, value, **kw)

    update.__name__ = update.__qualname__ = method
    return update


for _row in _surface.AT:
    setattr(_AtIndex, _row.name, _at_method(_row.name))

_hints.register_operations(_hints.Operations(binary=binary, unary=unary_op, getitem=getitem,
                                             getattr=getattr_))

# __jax_array__, __array__, __iter__, __len__, __bool__/__float__/..., __repr__, IndexError
_protocols.install(SArray, getitem=getitem, vma_off=in_vma_off)
