"""jaxtyping interop: one hint for the manual-axis state, the dtype and the shape of a value.

`st.Float[Varying["dp"], "batch/dp d"]` accepts a value (typed, or a raw JAX value inside
shard_map) that

1. is in state `Varying["dp"]` (the same check as the hint alone: covariant in Varying);
2. has a floating dtype (jaxtyping's `Float`);
3. has the **local** (per-device) shape `(batch / |dp|, d)`: a dimension written `name/axis`
   (or `name/(a,b)` for several axes) is partitioned over those mesh axes, so its global size
   `name` is the local size times the axis sizes. jaxtyping checks the *global* sizes, so the
   names bind consistently across arguments under `@jaxtyped(typechecker=beartype)`: a
   `"batch/dp d"` argument and a `"batch d"` argument (unpartitioned, e.g. after
   `all_gather(..., tiled=True)`) must agree on `batch`.

Dimensions without `/` are not partitioned: local size == global size. Every other jaxtyping
dimension syntax (`*batch`, `...`, `#b`, `_`, `3`, `b=3`) passes through unchanged. Axis sizes
are read with `jax.lax.axis_size`, so the hint is checked inside shard_map (at trace time).

Statically (mypy, pyright) the hint is `Annotated[Varying["dp"], "batch/dp d"]`, i.e. the
state hint: the plugin computes states, jaxtyping checks shapes at runtime.

Plain jaxtyping also works with a state class as its array type: `jaxtyping.Float[Varying["dp"],
"b d"]` checks the state and the local shape `(b, d)`.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

import jax
import jaxtyping

from .._errors import error
from . import hints as _hints
from .hints import describe_mismatch, is_state_class, spmd_type_of

_TOKEN = re.compile(r"\S*\([^)]*\)\S*|\S+")
_PARTITIONED = re.compile(r"^(?P<dim>[^/]+)/(?P<axes>[A-Za-z_][\w\-]*|\([^)]*\))$")


class _GlobalView:
    """What jaxtyping checks: the global shape and the dtype of a local value."""

    __slots__ = ("dtype", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: Any) -> None:
        self.shape = shape
        self.dtype = dtype


def _parse(dims: str, family: str) -> tuple[str, tuple[tuple[str, ...], ...]]:
    """`"batch/dp d"` -> (`"batch d"`, ((`"dp"`,), ())): jaxtyping's dims and the axes of each."""
    out_dims: list[str] = []
    out_axes: list[tuple[str, ...]] = []
    for tok in _TOKEN.findall(dims):
        m = _PARTITIONED.match(tok)
        if m is None:
            if "/" in tok:
                raise error("SPMD504", f"{family}[..., {dims!r}]: cannot read {tok!r}; write "
                            f"'name/axis' or 'name/(axis1,axis2)'", fix="'batch/dp d'")
            out_dims.append(tok)
            out_axes.append(())
            continue
        axes = m.group("axes").strip("()")
        names = tuple(a.strip() for a in axes.split(",") if a.strip())
        out_dims.append(m.group("dim"))
        out_axes.append(names)
    return " ".join(out_dims), tuple(out_axes)


class _ShapedMeta(type):
    """Metaclass of the combined hints: state check, then jaxtyping on the global view."""

    _state: type
    _jaxtyping: Any
    _axes: tuple[tuple[str, ...], ...]
    _variadic: bool

    def __instancecheck__(cls, obj: object) -> bool:
        return cls.__instancecheck_str__(obj) == ""

    def __instancecheck_str__(cls, obj: object) -> str:
        """beartype's hook: "" if `obj` fits, else why not (lowercase clause, no period)."""
        if not isinstance(obj, cls._state):
            want, have = _hints.hint_type(cls._state), spmd_type_of(obj)
            if have is None:
                return type(cls._state).__instancecheck_str__(cls._state, obj)  # type: ignore[attr-defined,no-any-return]
            return describe_mismatch(want, have) if want is not None else "the state does not fit"
        shape = tuple(getattr(obj, "shape", ()))
        if len(shape) != len(cls._axes) and not cls._variadic:
            return (f"this value has local shape {shape}, but the hint has {len(cls._axes)} "
                    f"dimensions")
        try:
            global_shape = tuple(
                n * math.prod(_axis_size(a) for a in axes) for n, axes in zip(shape, _pad(cls._axes, len(shape)), strict=True))
        except NameError as e:
            return f"the axis size of {e.args[0]!r} is unknown here (the hint needs shard_map)"
        why = cls._jaxtyping.__instancecheck_str__(_GlobalView(global_shape, obj.dtype))  # type: ignore[attr-defined]
        if why and global_shape != shape:
            return f"(local shape {shape}, global {global_shape}) {why.rstrip('.')}"
        return str(why).rstrip(".")


def _pad(axes: tuple[tuple[str, ...], ...], n: int) -> tuple[tuple[str, ...], ...]:
    return axes + ((),) * (n - len(axes))


def _axis_size(axis: str) -> int:
    try:
        return int(jax.lax.axis_size(axis))
    except Exception:  # noqa: BLE001 - outside shard_map JAX raises NameError (unbound axis)
        raise NameError(axis) from None


class _DtypeFamily:
    """`Float`, `Int`, ...: subscript with a state hint and a dims string."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.jaxtyping = getattr(jaxtyping, name)

    def __repr__(self) -> str:
        return f"spmdtyped.{self.name}"

    def __getitem__(self, params: tuple[Any, str]) -> type:
        if not isinstance(params, tuple) or len(params) != 2 or not isinstance(params[1], str):
            raise error("SPMD504", f"st.{self.name}[state, dims] takes a state hint and a dims "
                        f"string, e.g. st.{self.name}[Varying['dp'], 'batch/dp d']")
        return _combined(self.name, params[0], params[1])


@functools.cache
def _combined(family: str, state: Any, dims: str) -> type:
    if not is_state_class(state):
        raise error("SPMD504", f"st.{family}[state, dims]: {state!r} is not a state hint (use "
                    f"Varying['dp'], Typed[...], Invariant)")
    global_dims, axes = _parse(dims, family)
    variadic = any(t.startswith(("*", "...", "#*")) for t in global_dims.split())
    if variadic and any(axes):
        raise error("SPMD504", f"st.{family}[..., {dims!r}]: partitioned dimensions cannot be "
                    f"combined with a variadic dimension")
    want = _hints.hint_type(state)
    if want is not None:
        for part in axes:
            bad = [a for a in part if a not in want.varying]
            if bad:
                raise error("SPMD504", f"st.{family}[{state.__qualname__}, {dims!r}]: a dimension "
                            f"is partitioned over {bad[0]!r}, so the value is Varying there, but "
                            f"the state hint says {want.state(bad[0]).title}", axes=bad,
                            fix=f"st.{family}[Varying[{bad[0]!r}], {dims!r}]")
    checker = getattr(jaxtyping, family)[_GlobalView, global_dims]
    name = f"{family}[{state.__qualname__}, {dims!r}]"
    return _ShapedMeta(name, (), {"_state": state, "_jaxtyping": checker, "_axes": axes,
                                  "_variadic": variadic,
                                  "__module__": "spmdtyped", "__qualname__": name,
                                  "__slots__": ()})


Shaped = _DtypeFamily("Shaped")
Float = _DtypeFamily("Float")
Int = _DtypeFamily("Int")
Bool = _DtypeFamily("Bool")
Num = _DtypeFamily("Num")
Inexact = _DtypeFamily("Inexact")

__all__ = ["Bool", "Float", "Inexact", "Int", "Num", "Shaped"]
