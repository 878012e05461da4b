"""A memo of a pure function of hashable arguments (the spec readers, the name-stack reader):
`functools.lru_cache` where the arguments hash, the function itself where one does not."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def hashable_cache(maxsize: int) -> Callable[[_F], _F]:
    """`functools.lru_cache(maxsize)` of the decorated function, called through uncached for
    arguments that do not hash (a spec or a name stack JAX does not make hashable)."""
    def decorate(fn: _F) -> _F:
        cached = functools.lru_cache(maxsize=maxsize)(fn)

        @functools.wraps(fn)
        def call(*args: Any) -> Any:
            try:
                return cached(*args)
            except TypeError:   # an argument that does not hash
                return fn(*args)
        return call  # type: ignore[return-value]
    return decorate
