"""States: the four per-axis states, `SpmdType` (a value's state on every manual axis), and
the cotangent swap. The vocabulary every other rule module speaks."""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Iterable, Sequence
from typing import Any

from .._errors import error


class State(enum.StrEnum):
    """The state of a value on one manual mesh axis."""

    INVARIANT = "invariant"
    VARYING = "varying"
    UNREDUCED = "unreduced"
    REDUCED = "reduced"

    @property
    def title(self) -> str:
        return self.value.capitalize()


I, V, U, R = State.INVARIANT, State.VARYING, State.UNREDUCED, State.REDUCED  # noqa: E741

UNREDUCED_KINDS = ("sum", "max", "min")


def _axes_set(value: Iterable[str] | str | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset((value,))
    return frozenset(value)


@dataclasses.dataclass(frozen=True)
class SpmdType:
    """The manual-axis state of a value: the axes it is Varying, Unreduced and Reduced on.

    Every other axis is Invariant. Equal to JAX's `jax.typeof(raw).manual_axis_type` for the
    same value (`unreduced_kind` is `None` unless the value is Unreduced; JAX 0.12 records
    `"sum"`, `"max"` or `"min"` there, JAX 0.10 only has sums).

    **Arguments:**

    - `varying`, `unreduced`, `reduced`: iterables of axis names (a `str` counts as one axis).
    - `unreduced_kind`: `"sum"`, `"max"`, `"min"` or `None` (= `"sum"` when `unreduced` is set).

    **Raises:** `UsageError` (SPMD504) when one axis is in two states.
    """

    varying: frozenset[str] = frozenset()
    unreduced: frozenset[str] = frozenset()
    reduced: frozenset[str] = frozenset()
    unreduced_kind: str | None = None

    def __init__(
        self,
        varying: Iterable[str] | str | None = (),
        unreduced: Iterable[str] | str | None = (),
        reduced: Iterable[str] | str | None = (),
        unreduced_kind: str | None = None,
    ) -> None:
        v, u, r = _axes_set(varying), _axes_set(unreduced), _axes_set(reduced)
        for name, s in (("varying", v), ("unreduced", u), ("reduced", r)):
            bad = [a for a in s if not isinstance(a, str)]
            if bad:
                raise error("SPMD504", f"SpmdType: {name} axes must be str, got {bad[0]!r}")
        for (n1, s1), (n2, s2) in (
            (("varying", v), ("unreduced", u)),
            (("varying", v), ("reduced", r)),
            (("unreduced", u), ("reduced", r)),
        ):
            common = s1 & s2
            if common:
                raise error(
                    "SPMD504",
                    f"SpmdType: axes {sorted(common)} cannot be both {n1} and {n2}",
                    axes=sorted(common),
                )
        if unreduced_kind is not None and unreduced_kind not in UNREDUCED_KINDS:
            raise error("SPMD504", f"SpmdType: unreduced_kind must be one of {UNREDUCED_KINDS}, "
                        f"got {unreduced_kind!r}")
        if not u:
            unreduced_kind = None
        elif unreduced_kind is None:
            unreduced_kind = "sum"
        object.__setattr__(self, "varying", v)
        object.__setattr__(self, "unreduced", u)
        object.__setattr__(self, "reduced", r)
        object.__setattr__(self, "unreduced_kind", unreduced_kind)
        # hashed at every lookup of its state class and every memo key holding it: computed once
        object.__setattr__(self, "_hash", hash((v, u, r, unreduced_kind)))

    def __hash__(self) -> int:
        return self._hash  # type: ignore[attr-defined,no-any-return]

    def __reduce__(self) -> tuple[Any, ...]:
        # pickle / copy: built again, so the hash is this process's (a string's hash, and so
        # a set of axis names', differs from process to process)
        return (SpmdType, (self.varying, self.unreduced, self.reduced, self.unreduced_kind))

    def __eq__(self, other: object) -> bool:
        # (the state classes' cache compares each looked-up type with its key: the rules
        # build equal types afresh)
        if self is other:
            return True
        if type(other) is not SpmdType:
            return NotImplemented
        return (self._hash == other._hash and self.varying == other.varying  # type: ignore[attr-defined]
                and self.unreduced == other.unreduced and self.reduced == other.reduced
                and self.unreduced_kind == other.unreduced_kind)

    # -- queries
    def state(self, axis: str) -> State:
        if axis in self.varying:
            return V
        if axis in self.unreduced:
            return U
        if axis in self.reduced:
            return R
        return I

    @property
    def axes(self) -> frozenset[str]:
        """Every axis the value is not Invariant on (JAX's `mat.vur`)."""
        return self.varying | self.unreduced | self.reduced

    @property
    def kind(self) -> str:
        """The pending reduction of the Unreduced axes ("sum" unless JAX 0.12 says otherwise)."""
        return self.unreduced_kind or "sum"

    def replace(self, **kw: object) -> SpmdType:
        fields = dict(varying=self.varying, unreduced=self.unreduced, reduced=self.reduced,
                      unreduced_kind=self.unreduced_kind)
        fields.update(kw)
        return SpmdType(**fields)  # type: ignore[arg-type]

    def with_states(self, axes: Iterable[str], state: State) -> SpmdType:
        """This type with each of `axes` put in `state`."""
        a = frozenset(axes)
        v, u, r = self.varying - a, self.unreduced - a, self.reduced - a
        if state is V:
            v |= a
        elif state is U:
            u |= a
        elif state is R:
            r |= a
        return SpmdType(v, u, r, self.unreduced_kind if u else None)

    def states(self, axes: Iterable[str]) -> dict[str, str]:
        return {a: self.state(a).value for a in axes}

    # -- printing
    def __str__(self) -> str:
        parts = []
        for label, s in (("Varying", self.varying), ("Unreduced", self.unreduced),
                         ("Reduced", self.reduced)):
            if s:
                parts.append(f"{label}[{', '.join(repr(a) for a in sorted(s))}]")
        if not parts:
            return "Invariant"
        if len(parts) == 1:
            return parts[0]
        return f"Typed[{', '.join(parts)}]"

    def __repr__(self) -> str:
        extra = f", unreduced_kind={self.unreduced_kind!r}" if self.unreduced_kind not in (None, "sum") else ""
        return f"SpmdType({self}{extra})"

    def jax_str(self, order: Sequence[str] | None = None) -> str:
        """As `jax.typeof` prints it: `{V:dp, R:tp}` (empty for Invariant)."""
        def fmt(s: frozenset[str]) -> str:
            names = [a for a in order if a in s] if order else sorted(s)
            return names[0] if len(names) == 1 else f"({','.join(names)})"
        parts = [f"{k}:{fmt(s)}" for k, s in (("V", self.varying), ("U", self.unreduced),
                                               ("R", self.reduced)) if s]
        return "{" + ", ".join(parts) + "}" if parts else ""


INVARIANT = SpmdType()


@functools.lru_cache(maxsize=1024)
def cotangent(t: SpmdType) -> SpmdType:
    """The type of a cotangent of a value of type `t`: Unreduced and Reduced swap (reference §5)."""
    return SpmdType(t.varying, t.reduced, t.unreduced, "sum" if t.reduced else None)



def fmt_axes(axes: Sequence[str]) -> str:
    """Axes as a user writes them in a call: `'dp'` for one, `('dp', 'tp')` for several."""
    return repr(axes[0]) if len(axes) == 1 else repr(tuple(axes))
