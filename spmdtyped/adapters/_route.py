"""Routing `jax.lax`'s collectives through `spmdtyped.lax` while a body is traced, and the
manual axes of a shard_map call. Shared by `typed_shard_map` (`_typed`) and `infer`
(`_infer`)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import jax

from .. import _compat
from .. import lax as _slax

_ROUTE_LOCK = threading.RLock()
_ROUTE_DEPTH = [0]
_SAVED: dict[str, Any] = {}


@contextlib.contextmanager
def checked_lax() -> Iterator[None]:
    """Route `jax.lax`'s collectives through `spmdtyped.lax` inside the block.

    Code that calls `jax.lax.psum(...)` or `lax.psum(...)` after `from jax import lax` is
    checked; names imported before (`from jax.lax import psum`) are not (the jaxpr walk of
    `typed_shard_map` still sees them). Process-wide while active: meant for tracing.

    !!! Example
        ```python
        with st.adapters.checked_lax():
            jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=..., out_specs=...))(x)
        ```
    """
    with _ROUTE_LOCK:
        if _ROUTE_DEPTH[0] == 0:
            for name in _slax.CHECKED:
                _SAVED[name] = getattr(jax.lax, name)
                setattr(jax.lax, name, getattr(_slax, name))
        _ROUTE_DEPTH[0] += 1
    try:
        yield
    finally:
        with _ROUTE_LOCK:
            _ROUTE_DEPTH[0] -= 1
            if _ROUTE_DEPTH[0] == 0:
                for name, fn in _SAVED.items():
                    setattr(jax.lax, name, fn)
                _SAVED.clear()


def manual_axes(mesh: Any, axis_names: Any) -> tuple[str, ...]:
    """The manual axes of `shard_map(..., mesh=mesh, axis_names=axis_names)`, in mesh order."""
    mesh_axes = _compat.mesh_axis_names(mesh)
    names = {axis_names} if isinstance(axis_names, str) else set(axis_names or ())
    return tuple(a for a in mesh_axes if not names or a in names)
