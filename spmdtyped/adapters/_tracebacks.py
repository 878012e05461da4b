"""What a traceback says about the program JAX was tracing when it raised (the error paths of
the porting tools): the `jax.lax` collective an error was raised in (jax 0.10's bare
AssertionError for an axis the mesh lacks), the mesh of the shard_map around it, and which
shard_map body JAX rejected. Frames of JAX's modules are read by file and function name
(jax/_src/lax/parallel.py, jax/_src/shard_map.py; the same in jax 0.10 and 0.12) and their
locals by the public parameter names and types (`axis_name`, a `Mesh`); nothing is replaced.
"""

from __future__ import annotations

import gc
import os
import sys
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


def shard_map_bodies(thunk: Any) -> list[tuple[str, int]]:
    """Run `thunk` (which raises): the `(file, def line)` of each shard_map body JAX called, in
    order, seen by a profile hook of this thread set for the call only, below JAX's `f_wrapped`
    (jax/_src/shard_map.py, 0.10 and 0.12). For an error path: which body JAX rejected."""
    jax_dir = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
    here = os.path.join(jax_dir, "_src", "shard_map.py")
    lib = (jax_dir, os.path.dirname(os.path.abspath(os.__file__)) + os.sep)
    seen: list[tuple[str, int]] = []
    # code Python runs wherever an allocation or a release happens, not called by JAX: a gc
    # callback (hypothesis installs one) or a finalizer
    interrupts = {getattr(cb, "__code__", None) for cb in gc.callbacks}

    def passes(code: Any) -> bool:   # JAX's, the standard library's or generated code
        return code.co_filename.startswith("<") or os.path.abspath(code.co_filename).startswith(lib)

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event != "call" or passes(frame.f_code) or frame.f_code in interrupts \
                or frame.f_code.co_name == "__del__":
            return
        back = frame.f_back
        while back is not None and passes(back.f_code):
            if back.f_code.co_name == "f_wrapped" and \
                    os.path.abspath(back.f_code.co_filename) == here:
                seen.append((frame.f_code.co_filename, frame.f_code.co_firstlineno))
                return
            back = back.f_back

    old = sys.getprofile()
    sys.setprofile(hook)
    try:
        thunk()
    except Exception:  # noqa: BLE001, S110 - the error is the caller's; only the bodies matter
        pass
    finally:
        sys.setprofile(old)
    return seen
