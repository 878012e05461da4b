"""Attribute access on typed values: `x.<method>(...)` and `x.<property>` by their rows of the
surface table (`_surface.METHODS`, `_surface.PROPERTIES`), and `x.at[idx].<update>(v)` (one
method per `_surface.AT` row). Importing this module registers the typed values' operations
with `hints` (the operators, indexing and attribute access the state classes' dunders call):
`hints` imports it when a typed value first needs one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from .. import _compat, _rules, _surface
from . import hints as _hints
from . import refining as _refining
from .array import (
    binary,
    checked,
    getitem,
    is_dynamic_index,
    is_typed,
    mean,
    operand,
    typed_call,
    typeof,
    unary_op,
    unwrap,
)
from .hints import SArray


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
        return unary_op(rule, x, lambda r: getattr(r, name), op=f".{name}",
                        refine=(row.refine, {"name": name}))
    if row.binding == "mean":
        return lambda axis=None, keepdims=False: mean(x, axis, keepdims=keepdims)
    refine = row.refine
    return lambda *args, **kw: typed_call(
        rule, x, _method(name), args, kw, op=f".{name}()", refine=refine,
        params=lambda: _method_params(name, x, args, kw))


@functools.cache
def _method(name: str) -> Callable[..., Any]:
    """`r.<name>(*args, **kwargs)` as a function of `r` (one per method: a memo key)."""
    def call(r: Any, *args: Any, **kwargs: Any) -> Any:
        return getattr(r, name)(*args, **kwargs)
    return call


def _method_params(name: str, x: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> dict[str, Any]:
    """A method call's arguments by name, as `jnp.<name>(x, ...)` binds them
    (`x.transpose(1, 0)` takes the permutation as separate arguments)."""
    if name == "transpose":
        axes = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
        return {"axes": tuple(axes) or kw.get("axes")}
    fn = getattr(jnp, name, None)
    return _refining.call_params(fn, x.raw, unwrap(args), unwrap(kw)) if fn is not None else {}


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
        items = idx if isinstance(idx, tuple) else (idx,)
        # traced indices: their states flow into the result (JAX pvarys the array to them)
        self.index_types = [typeof(i) for i in items
                            if is_typed(i) or isinstance(i, (jax.Array, jax.core.Tracer))]
        self.x, self.idx = x, unwrap(idx)

    def _update(self, method: str, value: Any, **kw: Any) -> Any:
        raw_v, tv = operand(value)
        op = f".at[].{method}()"
        out_t = _rules.at_update_type(method, typeof(self.x), tv, _compat.FEATURES, op=op,
                                      index=self.index_types)
        out = getattr(self.x.raw.at[self.idx], method)(raw_v, **kw)
        return checked(op, out, out_t, _refining.refine(
            "at", method, [self.x, value], out_t, out, op=op,
            params={"traced_index": is_dynamic_index(self.idx)}))


def _at_method(method: str) -> Callable[..., Any]:
    def update(self: _AtIndex, value: Any, **kw: Any) -> Any:
        return self._update(method, value, **kw)

    update.__name__ = update.__qualname__ = method
    return update


for _row in _surface.AT:
    setattr(_AtIndex, _row.name, _at_method(_row.name))

def jax_attribute(x: SArray, name: str) -> Any:
    """`x.<name>` as JAX's own code reads it (`_hints.Operations.jax_attribute`): the raw
    value's attribute (`__jax_array__`, with its refusals), and a tracer's `sharding` from its
    abstract value, as JAX reads it of a raw tracer (`lax.full_like`, which `jax.nn.relu`'s
    rule and `jnp.zeros_like` call: without it the fill took the default sharding, and on an
    Explicit mesh the select that follows failed)."""
    raw = x.__jax_array__()
    if name == "sharding" and isinstance(raw, jax.core.Tracer):   # (public in 0.10 and 0.12)
        return getattr(raw.aval, "sharding", None)
    return getattr(raw, name)


_hints.register_operations(_hints.Operations(binary=binary, unary=unary_op, getitem=getitem,
                                             getattr=getattr_, jax_attribute=jax_attribute))
