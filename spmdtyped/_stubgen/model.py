"""The overload model of the pyright stub: patterns over `SArray[V, U, R]`, how a checker
matches them, and how they print.

A pattern argument is `SArray[V, U, R]` whose slots are unions of axis literals and at most one
TypeVar (`Slot`), a Python scalar, or a raw JAX value. `match` decides, for concrete states,
whether an overload matches and what it returns, the way pyright 1.1.414 and mypy solve such
signatures (measured by the oracle tests in `tests/test_stubgen_oracle.py`):

- arguments are matched left to right, slots in the order V, U, R; a TypeVar is fixed by its
  first occurrence (no widening afterwards: a later argument must fit the value found);
- `V` is covariant: a later or literal-bearing V slot accepts any subset;
- `U` and `R` are invariant: the set must be equal;
- a TypeVar next to literals takes what the literals leave; when they leave nothing it stays
  unsolved in a V slot (an unsolved TypeVar in a result makes the result `Unknown`, counted as
  wrong) unless it has a default (`default=Never`: it is then `Never`; a `Never` argument still
  leaves it unsolved), and the argument does not match at all in a U or R slot;
- plain mypy (`mypy=True`) joins the literals a TypeVar next to literals must take: two or
  more join to `str`, which violates the TypeVar's bound, and the overload does not match
  (`Literal["dp"] | _Ro_dp` against `Literal["dp", "sp", "tp"]`); pyright subtracts.

A parameter may be a union of patterns (`Alt`): it matches when one of them does; a method's
`self` and `other` may be the receiver's own type (`Keep`).

Imports neither JAX nor mypy. Read by `_stubgen_select` (which checks every overload against
the rule table) and `_stubgen` (which writes the files).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence

from .._rules import SpmdType

#: a TypeVar's solution, or UNSOLVED
UNSOLVED = None


@dataclasses.dataclass(frozen=True)
class Var:
    """A TypeVar over axis names; `bound` None means `str` (any axis); `never_default`: declared
    with `default=Never` (PEP 696), which a V slot's TypeVar the literals leave nothing to
    takes instead of staying unsolved (see `_match_slot`)."""

    name: str
    bound: frozenset[str] | None = None
    never_default: bool = False

    def fits(self, axes: frozenset[str]) -> bool:
        return self.bound is None or axes <= self.bound


@dataclasses.dataclass(frozen=True)
class Slot:
    """One argument of `SArray[V, U, R]`: a union of axis literals and TypeVars, or `Any`."""

    lits: frozenset[str] = frozenset()
    vars: tuple[Var, ...] = ()
    any: bool = False


ANY = Slot(any=True)
NEVER = Slot()


def lit(*axes: str) -> Slot:
    return Slot(frozenset(axes))


def var(v: Var, *axes: str) -> Slot:
    """`Literal[axes] | v`; a TypeVar bound to no axis at all is `Never` (one-axis vocabularies)."""
    if v.bound is not None and not v.bound:
        return Slot(frozenset(axes))
    return Slot(frozenset(axes), (v,))


@dataclasses.dataclass(frozen=True)
class Arr:
    """A parameter or result `SArray[V, U, R]`."""

    v: Slot
    u: Slot
    r: Slot
    #: the generic class the pattern is spelled with (`_AtIndex` for `x.at[i]`)
    cls: str = "SArray"


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A Python scalar parameter: `int` or `float` (an int literal matters for `**`)."""

    kind: str  # "int" | "float"


@dataclasses.dataclass(frozen=True)
class Raw:
    """A raw JAX value (state unknown): accepted everywhere, result `_Untyped`."""


@dataclasses.dataclass(frozen=True)
class Keep:
    """The receiver's own type: a method's `self: _Keep` and `other: _Keep` / `-> _Keep`, one
    TypeVar bound to `SArray[Any, U, R]` where `unreduced` / `reduced` False means `Never`.

    Binding `self` solves the TypeVar to the receiver's exact state (pyright and mypy bind a
    TypeVar in `self` before the other arguments), so an `other: _Keep` takes a state whose
    Varying set is a subset of the receiver's and whose Unreduced and Reduced sets are equal,
    and the result is the receiver's state. Such an overload's return type holds no TypeVar once
    bound: a checker then evaluates it without the expected type of an enclosing call (a
    pattern's `SArray[_V1 | _V2, ...]` is matched against it once more), which is most of what
    a nested operator cost (docs/pyright.md, "Cost"). Methods only: a plain function solves the
    TypeVar over all its arguments."""

    unreduced: bool = True
    reduced: bool = True

    @property
    def name(self) -> str:
        return "_Keep" + ("" if self.unreduced else "U0") + ("" if self.reduced else "R0")


@dataclasses.dataclass(frozen=True)
class Alt:
    """A union of patterns `SArray[...] | SArray[...]` (literal sets, no TypeVar: both
    checkers match a union member by member)."""

    options: tuple[Arr, ...]


Param = Arr | Scalar | Raw | Alt | Keep


@dataclasses.dataclass(frozen=True)
class Overload:
    """One overload: parameters, result (`None`: `_Untyped`), deprecation text."""

    params: tuple[Param, ...]
    result: Arr | Keep | None
    deprecated: str | None = None
    #: a literal overload for one combination the generic patterns miss (at two axes)
    literal: bool = False
    #: what the selection found: the rule-table combinations it is the first match for
    covers: int = 0


# ------------------------------------------------------------------------------- concrete states

def states(axes: Sequence[str]) -> list[SpmdType]:
    """Every `SpmdType` over `axes` (4 ** len(axes) of them), Invariant first."""
    out = []
    for combo in itertools.product("IVUR", repeat=len(axes)):
        pick = {k: frozenset(a for a, s in zip(axes, combo, strict=True) if s == k) for k in "VUR"}
        out.append(SpmdType(pick["V"], pick["U"], pick["R"]))
    return out


# ------------------------------------------------------------------------------- matching

def _match_slot(slot: Slot, have: frozenset[str], covariant: bool,
                sol: dict[Var, frozenset[str] | None], free: bool = False,
                pinned: set[Var] | None = None, mypy: bool = False) -> bool:
    if slot.any:
        return True
    if free and len(slot.vars) == 1 and sol.get(slot.vars[0], UNSOLVED) is not UNSOLVED:
        # a plain function: pyright widens a TypeVar seen only in covariant slots so far
        (v,) = slot.vars
        x = sol[v]
        rest = have - slot.lits
        ok = have <= slot.lits | x if covariant else have == slot.lits | x  # type: ignore[operator]
        if not ok and v not in (pinned or set()) and v.fits(rest | x) and (  # type: ignore[operator]
                covariant or rest >= x):  # type: ignore[operator]
            sol[v] = rest | x  # type: ignore[operator]
            ok = True
        if ok and not covariant and pinned is not None:
            pinned.add(v)
        return ok
    if len(slot.vars) > 1:  # a union of TypeVars fixed by earlier slots
        if any(sol.get(x, UNSOLVED) is UNSOLVED for x in slot.vars):
            raise ValueError("a slot with two TypeVars needs both fixed by earlier slots")
        full = slot.lits.union(*(sol[x] for x in slot.vars))  # type: ignore[arg-type]
        if free and covariant and not have <= full:
            grow = next((x for x in slot.vars if x not in (pinned or set())
                         and x.fits(sol[x] | (have - full))), None)  # type: ignore[operator]
            if grow is not None:
                sol[grow] = sol[grow] | (have - full)  # type: ignore[operator]
                return True
        return have <= full if covariant else have == full
    if not slot.vars:
        return have <= slot.lits if covariant else have == slot.lits
    (v,) = slot.vars
    if v in sol and sol[v] is not UNSOLVED:
        full = slot.lits | sol[v]  # type: ignore[operator]
        return have <= full if covariant else have == full
    if not covariant and not slot.lits <= have:
        return False
    rest = have - slot.lits
    if not covariant and slot.lits and not rest:
        return False  # pyright: `Literal['a']` is not the same as `Literal['a'] | T`
    if mypy and slot.lits and len(rest) > 1:
        return False  # mypy joins the rest to `str`: the bound is violated
    if not v.fits(rest):
        return False
    if rest or not slot.lits:
        sol[v] = rest
        if not covariant and pinned is not None:
            pinned.add(v)
    elif v.never_default and have:
        # `Literal["tp"] | _Vd` against `Literal["tp"]`: both checkers take the default (pyright
        # 1.1.414; mypy solves it to Never with or without one); against `Never` pyright leaves
        # it Unknown
        sol[v] = frozenset()
    else:
        sol.setdefault(v, UNSOLVED)
    return True


def _eval(slot: Slot, sol: Mapping[Var, frozenset[str] | None],
          free: bool = False) -> frozenset[str] | None:
    out = slot.lits
    for v in slot.vars:
        got = sol.get(v, UNSOLVED)
        if got is UNSOLVED:
            return None
        out = out | got
    if free and len(slot.vars) > 1 and not out:
        return None  # pyright: `_V1 | _V2` with both solved to Never is Unknown
    return out


#: what `match` returns for a Scalar or Raw argument position
Arg = SpmdType | str  # "int" | "float" | "raw"


def _match_arr(p: Arr, a: SpmdType, sol: dict[Var, frozenset[str] | None], free: bool,
               pinned: set[Var], mypy: bool) -> bool:
    return all(_match_slot(slot, have, cov, sol, free, pinned, mypy)
               for slot, have, cov in ((p.v, a.varying, True), (p.u, a.unreduced, False),
                                       (p.r, a.reduced, False)))


def match(ov: Overload, args: Sequence[Arg], free: bool = False,
          mypy: bool = False) -> tuple[bool, SpmdType | str | None]:
    """(matches, result): the result is a SpmdType, "any" (Any / raw), or None (Unknown).

    `free`: a plain function, not a method: pyright solves its TypeVars over all arguments
    (a TypeVar seen only in V slots widens to the union), where a method binds `self` first.
    `mypy`: as plain mypy solves a TypeVar next to literals (module doc)."""
    if len(args) != len(ov.params):
        return False, None
    sol: dict[Var, frozenset[str] | None] = {}
    pinned: set[Var] = set()
    kept: SpmdType | None = None
    for p, a in zip(ov.params, args, strict=True):
        if isinstance(p, Keep):
            if free:
                raise ValueError("a Keep parameter is for methods: a function solves it over "
                                 "all its arguments")
            if not isinstance(a, SpmdType):
                return False, None
            if kept is None:  # `self`: bound first, to the receiver's exact state
                if (a.unreduced and not p.unreduced) or (a.reduced and not p.reduced):
                    return False, None
                kept = a
            elif not (a.varying <= kept.varying and a.unreduced == kept.unreduced
                      and a.reduced == kept.reduced):
                return False, None
        elif isinstance(p, Raw):
            if a != "raw":
                return False, None
        elif isinstance(p, Scalar):
            # int is accepted where float is (numeric promotion), not the other way round
            if a not in (("int",) if p.kind == "int" else ("int", "float")):
                return False, None
        elif isinstance(p, Alt):
            if not isinstance(a, SpmdType):
                return False, None
            for opt in p.options:
                trial, trial_pinned = dict(sol), set(pinned)
                if _match_arr(opt, a, trial, free, trial_pinned, mypy):
                    sol, pinned = trial, trial_pinned
                    break
            else:
                return False, None
        else:
            if not isinstance(a, SpmdType):
                return False, None
            if not _match_arr(p, a, sol, free, pinned, mypy):
                return False, None
    if ov.result is None:
        return True, "any"
    if isinstance(ov.result, Keep):
        return True, kept
    v, u, r = (_eval(s, sol, free) for s in (ov.result.v, ov.result.u, ov.result.r))
    if v is None or u is None or r is None or (v & u) or (v & r) or (u & r):
        return True, None
    return True, SpmdType(v, u, r)


def first_match(ovs: Sequence[Overload], args: Sequence[Arg], free: bool = False,
                mypy: bool = False) -> tuple[int, SpmdType | str | None]:
    """(index of the first overload that matches, its result); (-1, None) when none does."""
    for k, ov in enumerate(ovs):
        ok, res = match(ov, args, free, mypy)
        if ok:
            return k, res
    return -1, None


# ------------------------------------------------------------------------------- printing

def axis_type(axes: frozenset[str] | Sequence[str]) -> str:
    names = sorted(axes)
    if not names:
        return "Never"
    return "Literal[" + ", ".join(f'"{a}"' for a in names) + "]"


def slot_text(slot: Slot) -> str:
    if slot.any:
        return "Any"
    parts = [axis_type(slot.lits)] if slot.lits else []
    parts += [v.name for v in slot.vars]
    return " | ".join(parts) or "Never"


def param_text(p: Param) -> str:
    if isinstance(p, Alt):
        return " | ".join(param_text(o) for o in p.options)
    if isinstance(p, Arr):
        return f"{p.cls}[{slot_text(p.v)}, {slot_text(p.u)}, {slot_text(p.r)}]"
    if isinstance(p, Scalar):
        return p.kind
    if isinstance(p, Keep):
        return p.name
    return "_RawArray"


def result_text(r: Arr | Keep | None) -> str:
    return "_Untyped" if r is None else param_text(r)


def keep_typevars(ovs: Sequence[Overload]) -> list[str]:
    """The declarations of the `Keep` TypeVars the overloads use."""
    keeps = {q for ov in ovs for q in (*ov.params, ov.result) if isinstance(q, Keep)}
    out = []
    for k in sorted(keeps, key=lambda k: k.name):
        u, r = ("Any" if k.unreduced else "Never"), ("Any" if k.reduced else "Never")
        out.append(f'{k.name} = TypeVar("{k.name}", bound="SArray[Any, {u}, {r}]")')
    return out


def typevars(ovs: Sequence[Overload]) -> Iterator[Var]:
    """Every TypeVar the overloads use (for the declarations at the top of the stub)."""
    for ov in ovs:
        for q in (*ov.params, *((ov.result,) if ov.result else ())):
            for p in (q.options if isinstance(q, Alt) else (q,)):
                if not isinstance(p, Arr):
                    continue
                for s in (p.v, p.u, p.r):
                    yield from s.vars
