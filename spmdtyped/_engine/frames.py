"""Which frames of an equation's Python stack are the user's: the innermost frame outside
JAX, jaxlib, spmdtyped and the standard library is where an equation's violation is reported
(both walks and the report ask it of every equation they locate)."""

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
