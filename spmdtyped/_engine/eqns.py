"""What both walks read of a jaxpr equation that does not change while they walk it, read once
per check (issue 27, item 6: the engine's cost).

The state walk (`walk.Walk`) and the refinement walk (`refine_walk.RefineWalk`) visit every
equation of the program, nested jaxprs included. Each needs the equation's primitive, the
states JAX recorded for its operands and results, their shapes, its nested jaxprs and its
axes; derived from JAX's objects at every visit, these cost more than either walk's rules
(docs/performance.md §2). `Views` reads them once per equation and hands both walks the same
`EqnView`.
"""

from __future__ import annotations

from typing import Any

from .. import _compat
from .._rules import LITERAL, SpmdType
from .refine_facts import eqn_axes, is_literal, shape_of


class EqnView:
    """One equation's static facts (`Views.of`)."""

    __slots__ = ("eqn", "name", "types", "ins", "outs", "shapes", "out_shape", "subs", "axes",
                 "lits", "_frames", "_key")

    def __init__(self, eqn: Any) -> None:
        self.eqn = eqn
        #: the primitive, under its 0.12 name (`_compat.primitive_name`)
        self.name: str = _compat.primitive_name(eqn)
        lits, types, ins, shapes = [], [], [], []
        for v in eqn.invars:   # (one pass: every equation of every program is read here)
            lit = is_literal(v)
            t = _compat.aval_type(v.aval)
            lits.append(lit)
            types.append(t)
            ins.append(LITERAL if lit else t)
            shapes.append(shape_of(v))
        #: whether each operand is a literal
        self.lits: tuple[bool, ...] = tuple(lits)
        #: the state JAX recorded for each operand (a literal's too)
        self.types: tuple[SpmdType, ...] = tuple(types)
        #: the operands' states as the refinement rules take them: `LITERAL` for a literal
        self.ins: tuple[Any, ...] = tuple(ins)
        self.outs: tuple[SpmdType, ...] = tuple(_compat.aval_type(v.aval) for v in eqn.outvars)
        self.shapes: tuple[tuple[int, ...], ...] = tuple(shapes)
        self.out_shape: tuple[int, ...] = shape_of(eqn.outvars[0]) if eqn.outvars else ()
        #: the nested jaxprs (open), `_compat.sub_jaxprs`
        self.subs: tuple[Any, ...] = tuple(_compat.sub_jaxprs(eqn))
        #: the mesh axes a collective acts on (empty for other primitives)
        self.axes: tuple[str, ...] = eqn_axes(eqn)
        self._frames: tuple[tuple[str, int, str], ...] | None = None
        self._key: Any = _UNSET

    @property
    def frames(self) -> tuple[tuple[str, int, str], ...]:
        """The Python stack that bound the equation (`_compat.eqn_frames`), read on first use."""
        if self._frames is None:
            self._frames = _compat.eqn_frames(self.eqn)
        return self._frames

    def key(self, ids: dict[Any, int]) -> int | None:
        """A small number that stands for everything the walks read of the equation besides
        what they know of its operands (primitive, params, states, shapes, dtypes), equal for
        equal equations (`ids` numbers them); None when a param is not hashable."""
        if self._key is _UNSET:
            static = (self.name, tuple(self.eqn.params.items()), self.ins, self.outs, self.shapes,
                      self.out_shape, tuple(_dtype(v) for v in self.eqn.invars),
                      tuple(_dtype(v) for v in self.eqn.outvars))
            try:
                self._key = ids.setdefault(static, len(ids))
            except TypeError:   # a param JAX does not make hashable
                self._key = None
        return self._key  # type: ignore[no-any-return]


_UNSET: Any = object()


def _dtype(v: Any) -> Any:
    return getattr(getattr(v, "aval", None), "dtype", None)


class Views:
    """The `EqnView` of each equation of one program, read on first use. Both walks of a check
    share one (`check.check_shard_map`); it lives as long as the check, so no equation is kept
    alive after it."""

    __slots__ = ("_views", "ids")

    def __init__(self) -> None:
        self._views: dict[int, EqnView] = {}
        #: the static keys of the equations (`EqnView.key`)
        self.ids: dict[Any, int] = {}

    def of(self, eqn: Any) -> EqnView:
        got = self._views.get(id(eqn))
        if got is None or got.eqn is not eqn:
            got = self._views[id(eqn)] = EqnView(eqn)
        return got
