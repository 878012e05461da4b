"""Python and NumPy protocols of typed values, like `jax.Array`'s.

- `__jax_array__`: `jnp.*`, `jax.nn.*`, optax, equinox and flax accept typed values; the result
  is a raw JAX value whose state JAX itself tracks (`st.typeof` and the collectives read it).
  A plain JAX op could silently drop an Unreduced state (reference §6: `cumsum`, `where`,
  `**`, ...), so an Unreduced value refuses with SPMD202 naming the `st.numpy` function (or the
  reduction to do first). Under `check_vma=False` JAX tracks no state at all, so a non-Invariant
  value refuses too (its state would be lost).
- `jax.lax` primitives (`lax.exp`, `lax.dot_general`, ...) accept typed values through JAX's
  value-canonicalisation hook (`_compat.register_value_handler`), with the same refusals.
- `__array__` (NumPy, outside tracing), `__iter__` (finite, rows as typed values), `__len__`,
  `__bool__`/`__float__`/`__int__`/`__index__`/`__complex__` (JAX's own errors under tracing),
  `__repr__` (state, local shape and dtype).

`install(SArray)` puts them onto the typed value class once (`_array` calls it).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np

from .. import _compat, _rules, _surface
from .._errors import error
from .._rules.refine import describe
from . import hints as _hints

#: jax.numpy / jax.nn function name -> the st.* function with the rule for it
_REPLACEMENTS: dict[str, str] = {
    **{r.name: f"st.numpy.{r.name}" for r in _surface.NUMPY},
    **{r.name: f"st.nn.{r.name}" for r in _surface.NN},
}
_JAX_MODULES = ("jax.", "jaxlib.")
_WRAPPERS = frozenset({"reraise_with_filtered_traceback", "cache_miss", "call_impl", "bind",
                       "bind_with_trace", "wrapper", "wrapped", "inner", "fun"})


def _jax_caller(depth: int = 2) -> str | None:
    """The JAX function the user called (e.g. `cumsum` for `jnp.cumsum(x)`): among the JAX
    frames above the caller, the outermost one with a typed replacement, else the outermost
    public-looking one (jit wrappers such as `reraise_with_filtered_traceback` are skipped)."""
    f = sys._getframe(depth)
    names: list[str] = []
    while f is not None:
        mod = f.f_globals.get("__name__", "")
        if mod.startswith(_JAX_MODULES):
            names.append(f.f_code.co_name)
        elif names:
            break
        f = f.f_back
    names.reverse()  # outermost first
    for n in names:
        if n in _REPLACEMENTS:
            return n
    for n in names:
        if not n.startswith("_") and n not in _WRAPPERS:
            return n
    return None


def _refuse_unreduced(x: Any, what: str | None) -> Any:
    t: _rules.SpmdType = type(x)._spmd_type
    axes = tuple(sorted(t.unreduced))
    ax = axes[0] if len(axes) == 1 else axes
    replacement = _REPLACEMENTS.get(what or "")
    op = f"jax {what}" if what else "a jax operation"
    fix = f"y = {what or 'f'}(st.psum(u, {ax!r}))"
    if replacement:
        fix = (f"y = {replacement}(u)  # applies the rule: linear ops keep Unreduced, non-linear "
               f"ones ask for the reduction; or reduce first: {fix}")
    return error("SPMD202", f"{op} on an Unreduced value ({t}): JAX could silently drop the "
                 f"pending sum", op=op, axes=axes, states={a: "unreduced" for a in axes},
                 fix=fix)


def _refuse_untracked(x: Any, what: str | None) -> Any:
    t = type(x)._spmd_type
    op = f"jax {what}" if what else "a jax operation"
    replacement = _REPLACEMENTS.get(what or "")
    return error("SPMD202", f"{op} on a {t} value inside st.shard_map(check_vma=False): JAX "
                 f"tracks no state there, so the result's state would be lost", op=op,
                 fix=(f"y = {replacement}(x)" if replacement else
                      "use the st.numpy / st.nn function, or st.shard_map(check_vma=True)"))


def _to_jax(x: Any, what: str | None) -> Any:
    t: _rules.SpmdType = type(x)._spmd_type
    if t.unreduced:
        raise _refuse_unreduced(x, what)
    if t.axes and _vma_off():
        raise _refuse_untracked(x, what)
    return x.raw


#: bound by `install` (from `_array`, which imports this module): the typed getitem and
#: whether an `st.shard_map(check_vma=False)` body is being traced
_HOOKS: dict[str, Any] = {}


def _vma_off() -> bool:
    return bool(_HOOKS["vma_off"]())


def jax_array(self: Any) -> Any:
    """`__jax_array__`: the raw JAX value (its state travels with it in JAX's own type)."""
    caller = sys._getframe(1)
    if caller.f_code.co_name.startswith("_operator_") and \
            caller.f_globals.get("__name__", "").endswith("array_methods"):
        # `raw + typed`: JAX's operator converts its other operand with __jax_array__; handing
        # back the typed value makes it return NotImplemented, so Python calls our reflected
        # operator, which types the result with the rule table (Unreduced + Unreduced, ...)
        return self
    return _to_jax(self, _jax_caller())


def _value_handler(x: Any) -> Any:
    # jax.lax primitives: Primitive.bind canonicalises each argument through this handler
    return _to_jax(x, _jax_caller())


def array(self: Any, dtype: Any = None, copy: Any = None) -> np.ndarray:
    """`__array__`: NumPy's view of a concrete value; JAX's TracerArrayConversionError under
    tracing (never an endless element-by-element walk)."""
    raw = self.raw
    out = np.asarray(raw, dtype=dtype)
    if copy:
        out = out.copy()
    return out


def iterate(self: Any) -> Iterator[Any]:
    """`__iter__`: rows along the first local dimension, each a typed value; finite."""
    shape = self.raw.shape
    if not shape:
        raise TypeError("iteration over a 0-d array")  # jax.Array's message
    return (self[i] for i in range(shape[0]))


def length(self: Any) -> int:
    shape = self.raw.shape
    if not shape:
        raise TypeError("len() of unsized object")  # jax.Array's message
    return int(shape[0])


def bounded_getitem(self: Any, idx: Any) -> Any:
    """Static integer indices past the end raise IndexError (as NumPy; JAX clamps them)."""
    items = idx if isinstance(idx, tuple) else (idx,)
    shape = self.raw.shape
    dim = 0
    for i in items:
        if i is None:
            continue
        if i is Ellipsis:
            break
        if isinstance(i, (int, np.integer)) and not isinstance(i, bool) and dim < len(shape):
            n = shape[dim]
            if not -n <= int(i) < n:
                raise IndexError(f"index {int(i)} is out of bounds for axis {dim} with size {n}")
        dim += 1
    return _HOOKS["getitem"](self, idx)


def _scalar(conv: Any) -> Any:
    def method(self: Any) -> Any:
        # JAX's own conversion: a ConcretizationTypeError under tracing, the value otherwise
        return conv(self.raw)

    method.__name__ = f"__{conv.__name__}__"
    return method


def formatted(self: Any, spec: str) -> str:
    """`format(x, ".2f")` / f-strings: the value formatted as `jax.Array` does (a scalar's
    number; JAX's error under tracing); an empty spec is `str(x)`."""
    return str(self) if not spec else format(self.raw, spec)


def contains(self: Any, item: Any) -> bool:
    """`item in x`: `jax.Array.__contains__` on the raw value (its errors: a 2-d array, a
    tracer)."""
    return bool(self.raw.__contains__(getattr(item, "raw", item)))


def index(self: Any) -> int:
    return self.raw.__index__()  # type: ignore[no-any-return]


def represent(self: Any) -> str:
    """`Varying['dp'](local float32[4,8], traced)`: the state, the local shape and dtype. In
    a shard_map called eagerly (JAX's `ShardMapTracer`, which holds each device's values),
    `eager` and, on the lines after, each device's values as JAX prints them."""
    raw = self.raw
    shape = ",".join(str(d) for d in getattr(raw, "shape", ()))
    dtype = getattr(raw, "dtype", "?")
    where = "traced" if isinstance(raw, jax.core.Tracer) else "concrete"
    ref = getattr(self, "refinement", None)    # Shard/Partial/Rep (issue 15) when known
    name = describe(type(self)._spmd_type, ref) if ref else type(self).__qualname__
    if type(raw).__name__ == "ShardMapTracer":   # (jax 0.10 and 0.12: eager shard_map)
        return f"{name}(local {dtype}[{shape}], eager):\n{raw}"
    return f"{name}(local {dtype}[{shape}], {where})"


def _register_class(cls: type) -> None:
    if cls._spmd_type is not None:  # type: ignore[attr-defined]
        _compat.register_value_handler(cls, _value_handler)


def install(cls: type, *, getitem: Any, vma_off: Any) -> None:
    """Put the protocols onto the typed value class `cls` (SArray) and register every state
    class, present and future, with JAX's primitive binding (`getitem`: the typed indexing
    after the bounds check; `vma_off`: whether a check_vma=False body is being traced)."""
    _HOOKS.update(getitem=getitem, vma_off=vma_off)
    cls.__jax_array__ = jax_array  # type: ignore[attr-defined]
    cls.__array__ = array  # type: ignore[attr-defined]
    cls.__array_priority__ = 100  # type: ignore[attr-defined]  # NumPy defers to our operators
    cls.__iter__ = iterate  # type: ignore[attr-defined]
    cls.__len__ = length  # type: ignore[attr-defined]
    cls.__getitem__ = bounded_getitem  # type: ignore[attr-defined]
    cls.__bool__ = _scalar(bool)  # type: ignore[attr-defined]
    cls.__float__ = _scalar(float)  # type: ignore[attr-defined]
    cls.__int__ = _scalar(int)  # type: ignore[attr-defined]
    cls.__complex__ = _scalar(complex)  # type: ignore[attr-defined]
    cls.__index__ = index  # type: ignore[attr-defined]
    cls.__format__ = formatted  # type: ignore[method-assign,assignment]
    cls.__contains__ = contains  # type: ignore[attr-defined,operator]
    cls.__repr__ = represent  # type: ignore[attr-defined]
    _hints.on_state_class(_register_class)
