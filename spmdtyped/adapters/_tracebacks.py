"""What a traceback says about the program JAX was tracing when it raised (the error paths of
the porting tools): the `jax.lax` collective an error was raised in (jax 0.10's bare
AssertionError for an axis the mesh lacks), the mesh of the shard_map around it, and which
shard_map call JAX rejected (its function, mesh, specs and arguments). Frames of JAX's modules
are read by file and function name (jax/_src/lax/parallel.py, jax/_src/shard_map.py; the same
in jax 0.10 and 0.12) and their locals by the public parameter names and types (`axis_name`,
a `Mesh`, `jax.shard_map`'s own parameter names); nothing is replaced.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax


def collective_call(exc: BaseException, names: Any) -> tuple[str, Any] | None:
    """`(name, axis_name)` of the innermost `jax.lax` collective among `names` that `exc` was
    raised in, from its traceback before JAX filters it (catch it inside the traced function);
    None if none. (jax 0.10 raises a bare AssertionError for an axis the mesh lacks.)"""
    parallel = os.path.join(os.path.dirname(os.path.abspath(jax.__file__)), "_src", "lax",
                            "parallel.py")
    found = None
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name in names and "axis_name" in frame.f_locals \
                and os.path.abspath(frame.f_code.co_filename) == parallel:
            found = (frame.f_code.co_name, frame.f_locals["axis_name"])
        tb = tb.tb_next
    return found


def traceback_mesh(exc: BaseException) -> Any:
    """The innermost `jax.sharding.Mesh` / `AbstractMesh` a frame of `exc`'s traceback holds
    as `mesh` (the shard_map the error was raised in), or None."""
    found, tb = None, exc.__traceback__
    while tb is not None:
        m = tb.tb_frame.f_locals.get("mesh")
        if isinstance(m, (jax.sharding.Mesh, jax.sharding.AbstractMesh)):
            found = m
        tb = tb.tb_next
    return found


@dataclasses.dataclass(frozen=True)
class ShardMapCall:
    """A `jax.shard_map(f, ...)(*args)` call as JAX's frame holds it (its `wrapped`)."""

    f: Any
    mesh: Any
    in_specs: Any
    out_specs: Any
    axis_names: Any
    args: tuple[Any, ...]


def shard_map_call(exc: BaseException) -> ShardMapCall | None:
    """The innermost shard_map call `exc` was raised in, read from the locals of the
    `wrapped` function of jax/_src/shard_map.py in its traceback (0.10 and 0.12; catch the
    exception inside the traced function, before JAX filters its traceback); None if none."""
    here = os.path.join(os.path.dirname(os.path.abspath(jax.__file__)), "_src", "shard_map.py")
    found, tb = None, exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        loc = frame.f_locals
        if frame.f_code.co_name == "wrapped" and os.path.abspath(frame.f_code.co_filename) == here \
                and all(k in loc for k in ("f", "mesh", "in_specs", "out_specs", "args")):
            found = ShardMapCall(loc["f"], loc["mesh"], loc["in_specs"], loc["out_specs"],
                                 loc.get("axis_names", frozenset()), tuple(loc["args"]))
        tb = tb.tb_next
    return found
