"""What both walks read of a jaxpr equation that does not change while they walk it, read once
per check (issue 27, item 6: the engine's cost).

The state walk (`walk.Walk`) and the refinement walk (`refine_walk.RefineWalk`) visit every
equation of the program, nested jaxprs included. Each needs the equation's primitive, the
states JAX recorded for its operands and results, their shapes, its nested jaxprs and its
axes; derived from JAX's objects at every visit, these cost more than either walk's rules
(docs/performance.md §2). `Views` reads them once per check and hands both walks the same
`EqnView`.

Equations with the same primitive, params and abstract values (a program's repeated layers)
share their facts: JAX interns abstract values (`ShapedArray`, jax 0.10 and 0.12: equal ones
are one object), so `static_key` is a tuple of objects hashed by identity, and the facts are
read once per distinct equation. Its number (`EqnView.key`) is what the walks' memos key an
equation's rule on.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

from .. import _compat, _surface
from .._rules import LITERAL, SpmdType
from .._rules.refine import content as _rc
from .frames import user_frame
from .refine_facts import (
    CARRY_SCALARS,
    ByIdentity,
    eqn_axes,
    from_autodiff,
    is_literal,
    shape_of,
    var_type,
)

_aval = operator.attrgetter("aval")

#: the primitives the refinement walk never replays (`transfer`): each output of an
#: `optimization_barrier` keeps its own operand's inputs; a nested shard_map is walked
WALKED = frozenset({"optimization_barrier", "shard_map"})


def static_key(eqn: Any) -> tuple[Any, ...] | None:
    """What an equation's static facts are read from: primitive, params, the abstract values
    of its operands and results, which operands are literals; None when it cannot be a key.
    (Flat: the operands' count, then their avals, their variable types, the results' avals.)"""
    ins, outs = eqn.invars, eqn.outvars
    if len(outs) == 1:   # (the same tuple, built without `map` for most equations)
        if len(ins) == 2:
            a, b = ins
            return (eqn.primitive, tuple(eqn.params.items()), 2, a.aval, b.aval, type(a),
                    type(b), outs[0].aval)
        if len(ins) == 1:
            a = ins[0]
            return (eqn.primitive, tuple(eqn.params.items()), 1, a.aval, type(a), outs[0].aval)
    return (eqn.primitive, tuple(eqn.params.items()), len(ins), *map(_aval, ins),
            *map(type, ins), *map(_aval, outs))


def _scan_locate(frames: tuple[tuple[str, int, str], ...]
                 ) -> tuple[tuple[str, int] | None, bool]:
    user = user_frame(frames)
    return user, user is not None and from_autodiff(frames, user)


#: an equation's user frame and whether autodiff generated it there, by its stack (one tuple
#: per traceback, `_compat.eqn_frames`): one lookup per equation for both
_locate = ByIdentity(_scan_locate)


class _Static:
    """The facts equal equations share (see the module docstring)."""

    __slots__ = ("name", "lits", "types", "ins", "outs", "shapes", "out_shape", "subs", "axes",
                 "key", "literal", "replay", "summing", "carries")

    def __init__(self, eqn: Any, key: int | None,
                 types: Mapping[Any, SpmdType] | None = None) -> None:
        self.name: str = _compat.primitive_name(eqn)
        self.lits = tuple(is_literal(v) for v in eqn.invars)
        self.types = tuple(var_type(v, types) for v in eqn.invars)
        self.ins = tuple(LITERAL if lit else t for lit, t in zip(self.lits, self.types, strict=True))
        self.outs = tuple(var_type(v, types) for v in eqn.outvars)
        self.shapes = tuple(shape_of(v) for v in eqn.invars)
        self.out_shape = shape_of(eqn.outvars[0]) if eqn.outvars else ()
        self.subs = tuple(_compat.sub_jaxprs(eqn))
        self.axes = eqn_axes(eqn)
        self.key = key
        self.literal = True in self.lits
        self.replay = key is not None and not self.subs and self.name not in WALKED
        self.summing = _surface.AXIS_PRIMITIVES.get(self.name) in _rc.SUMMING
        self.carries = self.name in CARRY_SCALARS


class EqnView:
    """One equation's static facts (`Views.all`): those it shares with equal equations
    (`_Static`), copied into its own slots so the walks read each in one attribute lookup,
    and its own (the equation, its stack, its literals' values)."""

    __slots__ = ("eqn", "name", "lits", "types", "ins", "outs", "shapes", "out_shape", "subs",
                 "axes", "key", "literal", "replay", "summing", "carries", "transforms",
                 "_frames", "_values", "_located")

    def __init__(self, eqn: Any, facts: _Static, transforms: tuple[str, ...]) -> None:
        self.eqn = eqn
        #: the transformations that generated it, outermost first (`_compat.eqn_transforms`)
        self.transforms = transforms
        #: the primitive, under its 0.12 name (`_compat.primitive_name`)
        self.name: str = facts.name
        #: whether each operand is a literal
        self.lits: tuple[bool, ...] = facts.lits
        #: the state JAX recorded for each operand (a literal's too)
        self.types: tuple[SpmdType, ...] = facts.types
        #: the operands' states as the refinement rules take them: `LITERAL` for a literal
        self.ins: tuple[Any, ...] = facts.ins
        self.outs: tuple[SpmdType, ...] = facts.outs
        self.shapes: tuple[tuple[int, ...], ...] = facts.shapes
        self.out_shape: tuple[int, ...] = facts.out_shape
        #: the nested jaxprs (open), `_compat.sub_jaxprs`
        self.subs: tuple[Any, ...] = facts.subs
        #: the mesh axes a collective acts on (empty for other primitives)
        self.axes: tuple[str, ...] = facts.axes
        #: a number equal for equations with equal static facts (`static_key`), what the
        #: walks' memos key the equation's rule on; None when its params are not hashable
        self.key: int | None = facts.key
        #: whether an operand is a literal
        self.literal: bool = facts.literal
        #: whether the refinement walk may replay it (`transfer.replay`): it has a `key`, no
        #: nested jaxpr, and is not one of `WALKED`
        self.replay: bool = facts.replay
        #: a sum over an axis whose residual check reads its operand's terms (`transfer.key`)
        self.summing: bool = facts.summing
        #: its results hold the scalar constant its first operand holds (`CARRY_SCALARS`)
        self.carries: bool = facts.carries
        self._frames: tuple[tuple[str, int, str], ...] | None = None
        self._values: tuple[object | None, ...] | None = None
        self._located: tuple[tuple[str, int] | None, bool] | None = None

    @property
    def frames(self) -> tuple[tuple[str, int, str], ...]:
        """The Python stack that bound the equation (`_compat.eqn_frames`), read on first use."""
        if self._frames is None:
            self._frames = _compat.eqn_frames(self.eqn)
        return self._frames

    @property
    def user(self) -> tuple[str, int] | None:
        """The user's frame of the equation (`frames.user_frame`), read on first use."""
        got = self._located
        if got is None:
            got = self._located = _locate(self.frames)
        return got[0]

    def autodiff(self, parent: tuple[str, int] | None) -> bool:
        """Whether JAX's autodiff generated the equation (`refine_facts.from_autodiff`), its
        location the user's frame or else `parent` (the enclosing equation's)."""
        got = self._located
        if got is None:   # (`frames`, inline: one call per equation of every walk)
            frames = self._frames
            if frames is None:
                frames = self._frames = _compat.eqn_frames(self.eqn)
            got = self._located = _locate(frames)
        if got[0] is None:
            return from_autodiff(self.frames, parent)
        return got[1]

    @property
    def values(self) -> tuple[object | None, ...]:
        """Each operand's value when it is a scalar literal (`_compat.literal_value`), else
        None."""
        if self._values is None:
            self._values = tuple(_compat.literal_value(v) if lit else None
                                 for v, lit in zip(self.eqn.invars, self.lits, strict=True))
        return self._values


class Views:
    """The `EqnView` of each equation of one program, read on first use. Both walks of a check
    share one (`check.check_shard_map`); it lives as long as the check, so no equation is kept
    alive after it."""

    __slots__ = ("_static", "_transforms", "_shapes", "_shape_ids", "_lists", "types")

    def __init__(self, types: Mapping[Any, SpmdType] | None = None) -> None:
        #: the states to read instead of JAX's (`refine_facts.var_type`): a `check_vma=False`
        #: program's, read from what it computes (`unchecked.UncheckedWalk.types`)
        self.types = types
        self._static: dict[Any, _Static] = {}
        self._transforms: dict[int, tuple[Any, tuple[str, ...]]] = {}
        self._shapes: dict[int, tuple[Any, int | None]] = {}
        self._shape_ids: dict[tuple[Any, ...], int] = {}
        self._lists: dict[int, tuple[Any, list[EqnView]]] = {}

    def shape(self, jaxpr: Any) -> int | None:
        """A number equal for the nested jaxprs that both walks walk alike: the same equations
        (`EqnView.key`, Python stack, name-stack transformations, literal values) wired the
        same way. JAX traces some nested jaxprs anew at each call (a `custom_jvp` function's
        `call_jaxpr`, once per layer): keyed by identity, their walks' memos would miss at
        every layer. None when an equation has no key or a literal operand is not a scalar.
        A stack counts by identity (`_compat.eqn_frames` gives equal tracebacks one tuple;
        the views keep each alive while the check runs, so an id is never reused meanwhile)."""
        hit = self._shapes.get(id(jaxpr))
        if hit is not None and hit[0] is jaxpr:
            return hit[1]
        index: dict[Any, int] = {v: i for i, v in enumerate((*jaxpr.constvars, *jaxpr.invars))}
        parts: list[Any] = [len(jaxpr.constvars), len(jaxpr.invars)]
        got: int | None = None
        for view in self.all(jaxpr):
            e = view.eqn
            if view.key is None:
                break
            wiring = tuple(("literal", view.values[i]) if lit else index.get(v, -1)
                           for i, (v, lit) in enumerate(zip(e.invars, view.lits, strict=True)))
            if -1 in wiring or ("literal", None) in wiring:
                break
            parts.append((view.key, id(view.frames), view.transforms, wiring))
            for o in e.outvars:
                index[o] = len(index)
        else:
            out = tuple(("literal", _compat.literal_value(v)) if is_literal(v) else index.get(v, -1)
                        for v in jaxpr.outvars)
            got = self._shape_ids.setdefault((*parts, out), len(self._shape_ids))
        self._shapes[id(jaxpr)] = (jaxpr, got)
        return got

    def call_key(self, view: EqnView) -> tuple[Any, ...] | None:
        """What the walk of a call's nested jaxprs reads of the call besides its operands: the
        primitive, the nested jaxprs' `shape`s, the operands' and results' abstract values and
        which operands are literals; None when a nested jaxpr has no shape. (Its `key` holds
        the jaxprs by identity, and JAX traces a `custom_jvp` function anew at every call.)"""
        shapes = tuple(self.shape(s) for s in view.subs)
        if None in shapes:
            return None
        eqn = view.eqn
        return (view.name, shapes, *map(_aval, eqn.invars), view.lits,
                *map(_aval, eqn.outvars))

    def transforms(self, eqn: Any) -> tuple[str, ...]:
        """`_compat.eqn_transforms(eqn)`, read once per name stack of the program (equations
        traced in one scope share it)."""
        try:
            stack = eqn.source_info.name_stack
        except AttributeError:
            stack = None
        hit = self._transforms.get(id(stack))
        if hit is None or hit[0] is not stack:
            hit = self._transforms[id(stack)] = (stack, _compat.eqn_transforms(eqn))
        return hit[1]

    def all(self, jaxpr: Any) -> list[EqnView]:
        """The views of the equations of `jaxpr` (open), in order; read once per jaxpr."""
        hit = self._lists.get(id(jaxpr))
        if hit is not None and hit[0] is jaxpr:
            return hit[1]
        facts, transforms = self._facts, self.transforms
        got = [EqnView(e, facts(e), transforms(e)) for e in jaxpr.eqns]
        self._lists[id(jaxpr)] = (jaxpr, got)
        return got

    def _facts(self, eqn: Any) -> _Static:
        key = static_key(eqn)
        types = self.types
        if types is not None and key is not None:   # equal equations of equal states
            key = (key, *(var_type(v, types) for v in (*eqn.invars, *eqn.outvars)))
        try:
            facts = None if key is None else self._static.get(key)
        except TypeError:   # a param JAX does not make hashable: facts of its own
            key = facts = None
        if facts is None:
            facts = _Static(eqn, None if key is None else len(self._static), types)
            if key is not None:
                self._static[key] = facts
        return facts
