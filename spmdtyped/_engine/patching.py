"""Temporarily replacing attributes of modules (`jax.lax.psum`, `jax.grad`) while a body is
traced: one lock, one depth count per patch, the originals restored when the outermost
block exits. Shared by `checked_lax` (`_conventions`) and `routed_autodiff` (`_refine_route`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

#: (module, attribute) -> its replacement, given the originals of every patched attribute
Replacements = Callable[[Mapping[tuple[Any, str], Any]], Mapping[tuple[Any, str], Any]]


class Patch:
    """A set of module attributes to replace while a block runs (`with patch.active(): ...`).

    Re-entrant and thread-safe: the first (outermost) entry saves the originals and installs
    the replacements, nested or concurrent entries only count, the last exit restores the
    originals. Process-wide while active: meant for tracing.

    - `targets`: the `(module, attribute name)` pairs to replace.
    - `replacements`: called on the first entry with the originals (so that a replacement
      can call the function it replaces); returns the replacement of each target.
    """

    def __init__(self, targets: tuple[tuple[Any, str], ...], replacements: Replacements) -> None:
        self._targets = targets
        self._replacements = replacements
        self._lock = threading.RLock()
        self._depth = 0
        self._saved: dict[tuple[Any, str], Any] = {}

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                saved = {(m, n): getattr(m, n) for m, n in self._targets}
                new = self._replacements(saved)
                for (module, name), value in new.items():
                    setattr(module, name, value)
                self._saved = saved
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    for (module, name), value in self._saved.items():
                        setattr(module, name, value)
                    self._saved = {}
