"""The refinement's data (DESIGN.md §1b): the per-axis kinds `Shard(dim)`, `PARTIAL`, `REP`,
`INDEX`, `ONEHOT`, the `Refinement` a value carries,, and the static checker's `LocalExtent`.

`refine` (which re-exports every name here) and `refine_shape` hold the rules. Pure data:
no JAX, no mypy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, Union


@dataclasses.dataclass(frozen=True, order=True)
class Shard:
    """The device's slice of a global array along local dim `dim` (negative: from the right)."""

    dim: int

    def __str__(self) -> str:
        return f"Shard({self.dim})"


class _Tag(str):
    __slots__ = ()


PARTIAL = _Tag("Partial")
REP = _Tag("Rep")
INDEX = _Tag("Index")
ONEHOT = _Tag("OneHot")

Kind = Union[Shard, _Tag]
#: the per-axis kind of an operand, as the rules see it: a Kind, "plain" Varying, or "fixed"
#: (not Varying on the axis: Invariant, Reduced -- equal on every device -- or Unreduced)
PLAIN = "plain"
FIXED = "fixed"


@dataclasses.dataclass(frozen=True)
class Refinement:
    """Per axis, what a Varying value is. Hashable (a pytree aux datum); empty = all plain."""

    items: tuple[tuple[str, Kind], ...] = ()
    #: the value carries array data (a shard_map input, a collective's result, or computed from
    #: one), as opposed to a constant built by `zeros`/`ones`/`full`/a literal: only such a
    #: replicated value laid along a Shard dim is SPMD215
    data: bool = False
    #: dims (negative) along which the value is known to be constant: made by `broadcast_to`
    #: from a missing or size-1 dim (a per-head parameter broadcast over the batch): laid along
    #: a Shard dim there it is not SPMD215. Only the broadcast's own result carries them.
    uniform: tuple[int, ...] = ()
    #: axes `S` such that the value is a replicated term divided by the number of devices of
    #: `S` (`b / st.axis_size("tp")`): added to a value that is Partial over every axis of `S`
    #: it is counted exactly once when the partial sums are reduced (the pre-divided
    #: row-parallel bias), so `+`/`-` take it as a Partial term. Only the division's own
    #: result carries it (any other op forgets it: a plain mean `total / n` stays replicated).
    share: tuple[str, ...] = ()
    #: the value is (computed from) a gradient: `st.grad`'s cotangents and what ops make of
    #: them. A psum of a Shard over its own axis is SPMD108 only for such values (expert
    #: gradients summed over the expert axis): an input sharded by its in_spec may as well be a
    #: stack of per-device terms, whose psum is right.
    grad: bool = False
    #: axes over which the value is a reduction across the devices (a psum/pmean/pmax/pmin
    #: over them of a value varying there, and elementwise ops of only such values): laid
    #: along a dim sharded over one of them it is not SPMD215 (`x - st.pmax(x, a)` combines
    #: each position with the reduction of the same position over the devices)
    across: tuple[str, ...] = ()
    #: the static checker's extents (it has no sizes): dims (negative) whose extent is the
    #: per-device extent of a dim sharded over these axes (`x[:h]` with `b, h = q.shape` and
    #: `q`'s dim 1 sharded over "tp"), as `(dim, axes)` pairs: the `LocalExtent` entries of
    #: the operand's shape the plugin gives the rules. The runtime reads shapes: never set.
    extents: tuple[tuple[int, tuple[str, ...]], ...] = ()
    #: the value is zero (`0.0 * b`: a term that keeps `b` in the program and adds nothing):
    #: added to a partial sum it is a Partial term on every axis (counted once per device,
    #: it sums to zero). The results of the ops `ZERO_FLOWS` names carry it (a product with a
    #: zero, a zero negated, divided, cast, copied or broadcast); any other op forgets it.
    zero: bool = False

    def __hash__(self) -> int:
        # computed once per value (the walks key their memos on refinements: hashed often)
        try:
            return self._hash  # type: ignore[attr-defined,no-any-return]
        except AttributeError:
            got = hash((self.items, self.data, self.uniform, self.share, self.grad, self.across,
                        self.extents, self.zero))
            object.__setattr__(self, "_hash", got)
            return got

    def __getstate__(self) -> dict[str, Any]:
        # pickle / copy: without the cached hash (a string's hash differs from process to
        # process), computed again on first use
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    @staticmethod
    def of(mapping: Mapping[str, Kind | None], data: bool = False) -> Refinement:
        return Refinement(tuple(sorted((a, k) for a, k in mapping.items() if k is not None)), data)

    def get(self, axis: str) -> Kind | None:
        for a, k in self.items:
            if a == axis:
                return k
        return None

    def as_dict(self) -> dict[str, Kind]:
        return dict(self.items)

    def restrict(self, varying: Iterable[str]) -> Refinement:
        keep = frozenset(varying)
        items = tuple((a, k) for a, k in self.items if a in keep)
        return self if len(items) == len(self.items) else dataclasses.replace(self, items=items)

    def shards_only(self, axes: Iterable[str]) -> Refinement:
        """On `axes`, where each device takes other elements (a permutation by varying keys,
        a cut at an offset that varies there), only Shards stay: Rep, Partial and the other
        kinds are plain."""
        drop = frozenset(axes)
        items = tuple((a, k) for a, k in self.items if a not in drop or isinstance(k, Shard))
        return self if len(items) == len(self.items) else dataclasses.replace(self, items=items)

    def with_data(self, data: bool) -> Refinement:
        return self if data == self.data else dataclasses.replace(self, data=data)

    def with_grad(self, grad: bool) -> Refinement:
        return self if grad == self.grad else dataclasses.replace(self, grad=grad)

    def with_extents(self, extents: tuple[tuple[int, tuple[str, ...]], ...]) -> Refinement:
        return self if extents == self.extents else dataclasses.replace(self, extents=extents)

    def __bool__(self) -> bool:
        return bool(self.items)

    def __str__(self) -> str:
        return ", ".join(f"{k}[{a!r}]" for a, k in self.items) or "plain"


NONE = Refinement()
DATA = Refinement(data=True)


@dataclasses.dataclass(frozen=True)
class LocalExtent:
    """A static extent: the per-device extent of a dim sharded over `axes` (the static checker
    knows no sizes, but knows `h` in `b, h, t, d = q.shape` is the local extent of `q`'s
    sharded dim 1). A replicated value of that extent laid along a dim sharded over one of
    `axes` was built for the local shard, whatever the number: SPMD215."""

    axes: tuple[str, ...]


#: one dim of an operand's shape: a size, a static `LocalExtent`, or None (unknown)
Extent = Union[int, LocalExtent, None]
