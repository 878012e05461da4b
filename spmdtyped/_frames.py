"""Which frames of a Python stack are the user's, one classification for every place that
names a line: the engine's walks (an equation's stack, `_engine/frames.py`), the translation
of JAX's errors (an exception's traceback, `_errors/jax_messages.py`) and the runtimes.

A frame is *library code* when it is JAX's, jaxlib's, spmdtyped's, the standard library's or
generated (`<string>`); the innermost other frame is where an error belongs. When that frame
is an installed third-party package's (optax's `global_norm`, an `equinox.nn` or
`flax.linen` layer, flax's `nn.scan`), `package_call_site` finds the user's line that called
into it: the line an error names, the package's beside it. Stacks are sequences of
`(file, line, function)`, innermost first.
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Sequence

import jax

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
#: frames in these directories are library code: JAX, jaxlib, spmdtyped, the standard library
_SKIP_DIRS = tuple(
    os.path.dirname(os.path.abspath(file)) + os.sep
    for file in (getattr(m, "__file__", None) for m in (jax, sys.modules.get("jaxlib")))
    if file
) + (_PKG_DIR + os.sep, os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep)


@functools.lru_cache(maxsize=4096)
def is_library(file: str) -> bool:
    """Whether a frame's file is library code (JAX, jaxlib, spmdtyped, the standard library,
    or generated code such as `<string>`)."""
    f = os.path.abspath(file)
    return f.startswith(_SKIP_DIRS) or file.startswith("<")


_INSTALLED = tuple(dict.fromkeys(
    os.path.abspath(p) + os.sep for p in (sysconfig.get_paths().get("purelib"),
                                          sysconfig.get_paths().get("platlib")) if p))


@functools.lru_cache(maxsize=4096)
def is_installed(file: str) -> bool:
    """Whether a frame's file belongs to an installed third-party package (under the
    interpreter's site-packages, or any `site-packages` / `dist-packages` directory); JAX and
    spmdtyped are library code of their own (`is_library`)."""
    f = os.path.abspath(file)
    return f.startswith(_INSTALLED) or f"{os.sep}site-packages{os.sep}" in f \
        or f"{os.sep}dist-packages{os.sep}" in f


_JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__)) + os.sep
#: JAX's modules of user-facing functions (`jnp.*`, `jax.nn.*`, `jax.lax.*`, ...), as
#: opposed to its tracing machinery
_JAX_API_DIRS = tuple(os.path.join(_JAX_DIR, "_src", d) + os.sep
                      for d in ("numpy", "nn", "lax", "ops", "scipy", "random", "image"))


def library_frames(frames: Sequence[tuple[str, int, str]]) -> list[tuple[str, str]]:
    """`(file, function)` of the library frames of `frames` (innermost first) between the
    bind and the user's code (all of them when the stack ends at a jitted JAX function's
    call, with no user frame)."""
    out = []
    for file, _line, fn in frames:
        if not is_library(file):
            break
        out.append((file, fn))
    return out


def called_jax_function(frames: Sequence[tuple[str, int, str]]) -> str | None:
    """The name of the JAX function the innermost user frame of `frames` called
    (`logsumexp` for a `sign` equation that `jax.nn.logsumexp` binds; the jitted function
    whose trace the stack ends at, `take_along_axis`), or None: the user's line called
    spmdtyped, or the frame is not a public function of JAX's API modules."""
    for file, fn in reversed(library_frames(frames)):   # from the user's call inwards
        path = os.path.abspath(file)
        if not path.startswith(_JAX_DIR):
            return None
        if path.startswith(_JAX_API_DIRS) and fn.isidentifier() and not fn.startswith("_"):
            return fn
    return None


def innermost_user(frames: Sequence[tuple[str, int, str]]) -> tuple[str, int] | None:
    """`(file, line)` of the innermost frame of `frames` that is not library code."""
    for file, line, _fn in frames:
        if not is_library(file):
            return file, line
    return None


def calling_frame() -> tuple[str, int] | None:
    """`(file, line)` of the innermost frame of the running stack that is not library code:
    the user's line that called into spmdtyped (through `jax.jit` or not)."""
    frame = sys._getframe(1)
    while frame is not None:
        if not is_library(frame.f_code.co_filename):
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


def package_call_site(frames: Sequence[tuple[str, int, str]], where: tuple[str, int]
                      ) -> tuple[str, int, str] | None:
    """`(file, line, function)` of the user's line that called, through an installed
    package, the library frame `where` of the stack `frames` (innermost first): the first
    frame outside it that is neither library code nor installed. None when `where` is not an
    installed package's frame of `frames`, or the whole stack is library code."""
    if not is_installed(where[0]):
        return None
    inside = False
    for file, line, fn in frames:
        if not inside:
            inside = (file, line) == tuple(where)
            continue
        if not is_library(file) and not is_installed(file):
            return file, line, fn
    return None


def in_package_note(where: tuple[str, int], function: str) -> str:
    """The detail an error named at the user's call into an installed package carries: the
    package's own line, and that the fix is in what the call passes it."""
    return (f"inside an installed package: {where[0]}:{where[1]}, called from your line below "
            f"(in {function}); the fix is in what that call passes it (its values, or the "
            f"function it runs)")
