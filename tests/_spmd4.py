"""Shared helpers of the issue-4 tests (autodiff, control flow, custom ops, st.numpy).

Programs are traced, not executed (`jax.jit(...).trace`): the states are known at trace time.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import spmdtyped as st
from spmdtyped import SpmdType

AXES = ("i", "j")
_MESH: list[Any] = []


def mesh() -> Any:
    if not _MESH:
        _MESH.append(jax.make_mesh((2, 4), AXES))
    return _MESH[0]


def all_states(axes: tuple[str, ...] = AXES) -> list[SpmdType]:
    """Every assignment of I/V/U/R to the axes (16 for two axes)."""
    out = []
    for combo in itertools.product("IVUR", repeat=len(axes)):
        sets: dict[str, set[str]] = {"V": set(), "U": set(), "R": set()}
        for a, s in zip(axes, combo, strict=False):
            if s != "I":
                sets[s].add(a)
        out.append(SpmdType(sets["V"], sets["U"], sets["R"]))
    return out


#: a smaller sample for the expensive products
SAMPLE = [SpmdType(), SpmdType(varying="i"), SpmdType(varying=("i", "j")), SpmdType(unreduced="i"),
          SpmdType(reduced="i"), SpmdType(varying="j", reduced="i"),
          SpmdType(varying="j", unreduced="i")]


def make_raw(x: Any, t: SpmdType) -> Any:
    """A raw JAX value of state `t` built from an Invariant raw value `x` (free casts only)."""
    if t.reduced:
        x = jax.lax.pcast(x, tuple(sorted(t.reduced)), to="reduced")
    vu = tuple(sorted(t.varying | t.unreduced))
    if vu:
        x = jax.lax.pcast(x, vu, to="varying")
    if t.unreduced:
        x = jax.lax.pcast(x, tuple(sorted(t.unreduced)), to="unreduced")
    return x


def make(x: Any, t: SpmdType) -> Any:
    """A typed value of state `t` (see `make_raw`)."""
    return st.wrap(make_raw(x, t))


def trace(fn: Callable[[Any], Any], shape: tuple[int, ...] = (4,), dtype: Any = jnp.float32) -> None:
    """Trace `fn(x)` inside a full-manual shard_map on the (i: 2, j: 4) mesh; `x` is an
    Invariant raw value of `shape`. Nothing is compiled or run."""
    def body(x: Any) -> Any:
        fn(x)
        return jnp.zeros((), jnp.float32)

    sm = jax.shard_map(body, mesh=mesh(), in_specs=P(), out_specs=P())
    jax.jit(sm).trace(jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh(), P())))


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) / ("spmd", code) / ("jax", exception type name) of calling `fn`."""
    try:
        return "ok", fn()
    except st.SpmdTypeError as e:
        return "spmd", e.code
    except Exception as e:  # noqa: BLE001 - JAX raises ValueError/TypeError/NotImplementedError/...
        return "jax", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"


def jax_type(raw: Any) -> SpmdType:
    return st.typeof(raw)
