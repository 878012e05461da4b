"""`st.axis_size` as a number that remembers its axes: `b / st.axis_size("tp")` (or
`b * (1 / st.axis_size("tp"))`) is a replicated term's share of a partial sum over `tp`, which
`refine.with_share` records (`Refinement.share`). Pure data: no JAX, no mypy."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["AxisShare", "AxisSize", "share_of"]


class AxisSize(int):
    """The number of devices along `axes`, as `st.axis_size` returns it: a Python int that
    remembers its axes, so that `b / st.axis_size("tp")` is known to be a replicated term's
    share of a partial sum over `tp` (`Refinement.share`). Every int operation gives a plain
    int; `1 / n` gives an `AxisShare`."""

    axes: tuple[str, ...]

    def __new__(cls, value: int, axes: Sequence[str]) -> AxisSize:
        self = super().__new__(cls, value)
        self.axes = tuple(sorted(axes))
        return self

    def __getnewargs__(self) -> tuple[int, tuple[str, ...]]:  # type: ignore[override]
        return int(self), self.axes

    def __rtruediv__(self, other: int) -> float:
        res = int.__rtruediv__(self, other)
        if type(other) is int and other == 1:
            return AxisShare(res, self.axes)
        return res


class AxisShare(float):
    """`1 / st.axis_size(axes)`: `b * (1 / n)` is the same share as `b / n`."""

    axes: tuple[str, ...]

    def __new__(cls, value: float, axes: Sequence[str]) -> AxisShare:
        self = super().__new__(cls, value)
        self.axes = tuple(axes)
        return self

    def __getnewargs__(self) -> tuple[float, tuple[str, ...]]:  # type: ignore[override]
        return float(self), self.axes


def share_of(name: str, values: Sequence[object]) -> tuple[int, tuple[str, ...]] | None:
    """`(i, axes)` when the elementwise op `name` on `values` divides operand `i` by the size
    of `axes` (`x / st.axis_size(a)`, `x * (1 / st.axis_size(a))`, `(1 / n) * x`); else None."""
    if len(values) != 2:
        return None
    x, y = values
    if name == "div" and isinstance(y, AxisSize):
        return 0, y.axes
    if name == "mul" and isinstance(y, AxisShare):
        return 0, y.axes
    if name == "mul" and isinstance(x, AxisShare):
        return 1, x.axes
    return None
