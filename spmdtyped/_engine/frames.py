"""Which frames of an equation's Python stack are the user's: the innermost frame outside
JAX, jaxlib, spmdtyped and the standard library is where an equation's violation is reported
(both walks and the report ask it of every equation they locate). When that frame is an
installed library's (optax's `global_norm`, an `equinox.nn` layer), `call_site` finds the
user's line that called into it: the line a violation names, the library's beside it."""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from collections.abc import Sequence

import jax

from .refine_facts import ByIdentity

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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


def call_site(frames: Sequence[tuple[str, int, str]], where: tuple[str, int]
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


def user_frame(frames: Sequence[tuple[str, int, str]]) -> tuple[str, int] | None:
    """The innermost frame outside JAX, spmdtyped and the standard library."""
    # an equation's frames are one tuple per traceback (`_compat.eqn_frames`): every walk of
    # the program asks for each equation's
    return _user_frame(frames) if isinstance(frames, tuple) else _scan_user_frame(frames)


def _scan_user_frame(frames: Sequence[tuple[str, int, str]]) -> tuple[str, int] | None:
    for file, line, _fn in frames:
        if not is_library(file):
            return file, line
    return None


_user_frame = ByIdentity(_scan_user_frame)
