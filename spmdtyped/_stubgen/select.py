"""Choose each stub overload from the rule table, and check it there.

For every form (an operator, a method, a `st.numpy`/`st.nn` function, a collective on one
axis), a fixed pool of candidate overloads (`_stubgen_model` patterns, made only of set
algebra: keep, union, move one axis between slots) is walked in order. A candidate is kept when
the state combinations it would be the first match for are all legal with exactly its result
(an exact overload), or all illegal (an `@deprecated` overload carrying the runtime's code and
fix). Which candidates survive is decided by `_rules` alone: no state rule is written here.
`verify` then replays the chosen list over every combination and counts legal-exact, false
errors, illegal caught and missed; `select` refuses (`StubError`) a list in which an overload
gives a legal combination a different result than the rule table.

Imports neither JAX nor mypy.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence

from .. import _rules
from .._errors import SpmdTypeError
from .._rules import LITERAL, SpmdType
from .model import (
    ANY,
    NEVER,
    Alt,
    Arg,
    Arr,
    Keep,
    Overload,
    Param,
    Scalar,
    Slot,
    Var,
    first_match,
    lit,
    states,
    var,
)


class StubError(ValueError):
    """The generator could not produce a stub that agrees with the rule table."""


#: a rule: the result state of concrete arguments, or the SpmdTypeError the runtime raises
Rule = Callable[[Sequence[Arg]], SpmdType | SpmdTypeError]


def _as_operand(a: Arg) -> _rules.Operand:
    return a if isinstance(a, SpmdType) else LITERAL


def outcome(fn: Callable[[], SpmdType]) -> SpmdType | SpmdTypeError:
    try:
        return fn()
    except SpmdTypeError as e:
        return e


def binary_rule(name: str, features: _rules.Features, op: str) -> Rule:
    """`a <name> b` as `_rules.binary` types it (an int scalar is an int literal)."""
    return lambda args: outcome(lambda: _rules.binary(
        name, _as_operand(args[0]), _as_operand(args[1]), features, op=op,
        int_literal=args[1] == "int").type)


def unary_rule(name: str, features: _rules.Features, op: str) -> Rule:
    return lambda args: outcome(lambda: _rules.unary(name, args[0], features, op=op))  # type: ignore[arg-type]


def axis_rule(name: str, axis: str, features: _rules.Features, op: str) -> Rule:
    return lambda args: outcome(lambda: _rules.axis_op(name, args[0], (axis,), features, op=op))  # type: ignore[arg-type]


def constructor_rule(name: str, features: _rules.Features) -> Rule:
    return lambda args: outcome(lambda: _rules.constructor_type(
        name, args[0] if args and isinstance(args[0], SpmdType) else None, features))


# ------------------------------------------------------------------------------- candidate pools

def _v(name: str, bound: Iterable[str] | None = None) -> Var:
    return Var(name, None if bound is None else frozenset(bound))


V1, V2, U, R = _v("_V1"), _v("_V2"), _v("_U"), _v("_R")


def _others(axes: Sequence[str], a: str) -> list[str]:
    return [b for b in axes if b != a]


def unary_pool(cls: str = "SArray") -> list[Overload]:
    """Keep / drop Unreduced and Reduced, whole sets at once (unary rules are per axis)."""
    out = []
    for u_in, r_in, u_out, r_out in (
            (U, R, U, R), (None, R, None, R), (None, R, None, None), (U, None, U, None),
            (None, None, None, None), (U, R, U, None)):
        def s(x: Var | None) -> Slot:
            return NEVER if x is None else var(x)
        out.append(Overload((Arr(var(V1), s(u_in), s(r_in), cls),),
                            Arr(var(V1), s(u_out), s(r_out))))
    # a rejected Reduced input gets its own message (the catch-all after it: Unreduced)
    out.append(Overload((Arr(var(V1), NEVER, var(R), cls),), None, "?"))
    return out


def constructor_pool() -> list[Overload]:
    return [Overload((Arr(var(V1), ANY, ANY),), Arr(var(V1), NEVER, NEVER)),
            Overload((Arr(ANY, ANY, ANY),), Arr(NEVER, NEVER, NEVER))]


def scalar_pool(kind: str, scalar_first: bool) -> list[Overload]:
    """An array and a Python scalar: the array's sets kept or dropped."""
    out = []
    for u_in, r_in, u_out, r_out in (
            (U, R, U, R), (None, R, None, R), (None, R, None, None), (U, None, U, None),
            (None, None, None, None)):
        def s(x: Var | None) -> Slot:
            return NEVER if x is None else var(x)
        arr = Arr(var(V1), s(u_in), s(r_in))
        params: tuple[Param, ...] = (Scalar(kind), arr) if scalar_first else (arr, Scalar(kind))
        out.append(Overload(params, Arr(var(V1), s(u_out), s(r_out))))
    return out


def keep_pool() -> list[Overload]:
    """An operator method whose operands share their Unreduced and Reduced sets and whose right
    operand is Varying on part of the left's axes: the result is the left operand's state
    (`self: _Keep, other: _Keep, /) -> _Keep`), widest bound first. Tried before the patterns:
    its return type is free of TypeVars once `self` is bound, so a checker does not match it
    against the expected type of an enclosing call (`st.psum(g @ w2, "tp")`: `g @ w2` is
    evaluated once per overload of `psum`; docs/pyright.md, "Cost")."""
    return [Overload((Keep(u, r), Keep(u, r)), Keep(u, r))
            for u, r in ((True, True), (False, True), (True, False), (False, False))]


def binary_pool(axes: Sequence[str], free: bool = False) -> list[Overload]:
    """Two arrays: set-union joins, Unreduced x Reduced, and the Reduced -> Varying auto-cast
    one axis at a time (linear in the number of axes)."""
    out: list[Overload] = []
    union = Slot(vars=(V1, V2))
    if free:  # plain functions: `_V1 | _V2` solved to Never is Unknown, so spell those apart
        for u, r in ((U, R), (None, R), (U, None), (None, None)):
            us = NEVER if u is None else var(u)
            rs = NEVER if r is None else var(r)
            out.append(Overload((Arr(NEVER, us, rs), Arr(NEVER, us, rs)), Arr(NEVER, us, rs)))
            out.append(Overload((Arr(var(V1), us, rs), Arr(NEVER, us, rs)), Arr(var(V1), us, rs)))
            out.append(Overload((Arr(NEVER, us, rs), Arr(var(V2), us, rs)), Arr(var(V2), us, rs)))
    for u, r, r_out in ((U, R, R), (None, R, R), (U, None, None), (None, None, None),
                        (None, R, None)):
        us = NEVER if u is None else var(u)
        rs = NEVER if r is None else var(r)
        ro = NEVER if r_out is None else var(r_out)
        out.append(Overload((Arr(var(V1), us, rs), Arr(var(V2), us, rs)), Arr(union, us, ro)))
    # the commonest shapes above come first (a checker stops at the first match); then Reduced
    # next to Invariant on one axis, which covariance would let through the auto-casts below
    for a in axes:
        o = _others(axes, a)
        i_pat = Arr(var(_v(f"_Vo_{a}", o)), var(_v(f"_Uo_{a}", o)), var(_v(f"_Ro_{a}", o)))
        i_pat2 = Arr(var(_v(f"_Vp_{a}", o)), var(_v(f"_Up_{a}", o)), var(_v(f"_Rp_{a}", o)))
        for r_a in (lit(a), var(_v(f"_Rq_{a}", o), a)):
            out.append(Overload((Arr(ANY, ANY, r_a), i_pat2), None, "?"))
            out.append(Overload((i_pat, Arr(ANY, ANY, r_a)), None, "?"))
    out.append(Overload((Arr(var(V1), var(U), NEVER), Arr(var(V2), NEVER, var(U))),
                        Arr(union, var(U), NEVER)))
    out.append(Overload((Arr(var(V1), NEVER, var(U)), Arr(var(V2), var(U), NEVER)),
                        Arr(union, var(U), NEVER)))
    # contractions drop Reduced: an Invariant operand, or a Reduced axis the other is
    # Invariant on
    out.append(Overload((Arr(NEVER, NEVER, NEVER), Arr(var(V2), NEVER, ANY)),
                        Arr(var(V2), NEVER, NEVER)))
    out.append(Overload((Arr(var(V1), NEVER, ANY), Arr(NEVER, NEVER, NEVER)),
                        Arr(var(V1), NEVER, NEVER)))
    for a in axes:
        vo = _v(f"_Vo_{a}", _others(axes, a))
        out.append(Overload((Arr(var(vo), NEVER, NEVER), Arr(var(V2), NEVER, lit(a))),
                            Arr(Slot(vars=(vo, V2)), NEVER, NEVER)))
        out.append(Overload((Arr(var(V1), NEVER, lit(a)), Arr(var(vo), NEVER, NEVER)),
                            Arr(Slot(vars=(V1, vo)), NEVER, NEVER)))
    for us in (var(U), NEVER):
        # Reduced -> Varying auto-cast of a whole Reduced set: the other operand is Varying on
        # it (a smaller Varying set is Invariant somewhere, caught above)
        out.append(Overload((Arr(var(V1), us, var(R)), Arr(Slot(vars=(R, V1)), us, NEVER)),
                            Arr(Slot(vars=(V1, R)), us, NEVER)))
        out.append(Overload((Arr(var(V1), us, NEVER), Arr(var(V2), us, var(V1))),
                            Arr(union, us, NEVER)))
        out.append(Overload((Arr(var(V1), us, var(R)), Arr(var(R), us, var(V1))),
                            Arr(Slot(vars=(V1, R)), us, NEVER)))
    for a in axes:
        o = _others(axes, a)
        for us in (var(U), NEVER):
            out.append(Overload((Arr(lit(a), us, NEVER), Arr(var(V2), us, lit(a))),
                                Arr(var(V2, a), us, NEVER)))
        out.append(Overload((Arr(var(_v(f"_Vo_{a}", o), a), ANY, NEVER), Arr(NEVER, ANY, lit(a))),
                            None, "?"))
        for us in (var(U), NEVER):
            out.append(Overload((Arr(var(V1, a), us, NEVER), Arr(var(V1), us, lit(a))),
                                Arr(var(V1, a), us, NEVER)))
        # one Reduced axis cast on the left (contractions: after the Reduced-drop patterns)
        out.append(Overload((Arr(var(V1), NEVER, lit(a)), Arr(var(V1, a), NEVER, NEVER)),
                            Arr(var(V1, a), NEVER, NEVER)))
    for r_first in (True, False):
        x, y = Arr(var(V1), NEVER, var(R)), Arr(var(V2), NEVER, NEVER)
        out.append(Overload((x, y) if r_first else (y, x), Arr(union, NEVER, NEVER)))
    return out


def unreduced_catches(axes: Sequence[str]) -> list[Overload]:
    """Unreduced on an axis on one side only (both orders), or on both sides (a product of
    partial sums), one axis at a time."""
    out = []
    for a in axes:
        o = _others(axes, a)
        lacks = Arr(ANY, var(_v(f"_Up_{a}", o)), ANY)
        # exactly `a`, or `a` and others
        has = [Arr(ANY, u_a, ANY) for u_a in (lit(a), var(_v(f"_Uq_{a}", o), a))]
        out += [Overload(ps, None, "?") for h in has for ps in ((h, lacks), (lacks, h))]
        out += [Overload((h1, h2), None, "?") for h1 in has for h2 in has]
    return out


_SLOTS = ("v", "u", "r")
_STATE_SLOT = {_rules.V: "v", _rules.U: "u", _rules.R: "r"}


def axis_pool(axes: Sequence[str], a: str) -> list[Overload]:
    """A collective or cast over one axis `a`: one pattern per state of `a` (exact: no other axis
    in that slot; others: a TypeVar bound to the other axes takes the rest; Varying has only the
    latter, its TypeVar defaulting to Never), each moved to every state; `@deprecated` catches
    for the states.

    Order: Invariant first (its patterns, then its catch), so that a covariant V pattern only
    sees values that hold `a` somewhere; then the V, U and R patterns, whose other slots are
    TypeVars bound to the other axes (a value holding `a` in another slot does not match them);
    the Reduced / Unreduced / Varying catches (unions of literal sets) last. Why this order: a
    checker evaluates a nested argument once per overload it tries (`st.psum(g @ w2, "tp")`), a
    union parameter once per member, and stops at the first match: the legal forms come before
    the catches a legal call never needs (docs/pyright.md, "Cost")."""
    o = _others(axes, a)
    out: list[Overload] = []
    # `default=Never` on all three (PEP 696: a TypeVar without a default may not follow one with
    # a default in a signature): the V pattern with the others `Literal[a] | _Vd_a` then takes
    # a value Varying on exactly `a` too (`_Vd_a` is Never), so no exact V pattern precedes it
    # (one overload fewer that a nested argument is evaluated under; docs/pyright.md, "Cost")
    vo, uo, ro = (Var(f"_{k}d_{a}", frozenset(o), never_default=True) for k in "VUR")
    bounded = {"v": var(vo), "u": var(uo), "r": var(ro)}
    catches: list[Overload] = []
    for s in (_rules.I, _rules.V, _rules.U, _rules.R):
        if s is _rules.I:
            shapes = [dict(bounded)]
            rest = [dict(bounded)]
        else:
            k = _STATE_SLOT[s]
            shapes, rest = [], []
            for split in ("exact", "others"):
                if split == "exact" and k == "v":
                    continue
                for clean in (False, True):
                    pat = {j: (NEVER if clean and j != "v" else bounded[j]) for j in _SLOTS}
                    pat[k] = lit(a) if split == "exact" else var({"v": vo, "u": uo, "r": ro}[k], a)
                    left = dict(pat)
                    left[k] = NEVER if split == "exact" else var({"v": vo, "u": uo, "r": ro}[k])
                    if clean and split == "others" and k != "v":
                        continue
                    shapes.append(pat)
                    rest.append(left)
            # the state's catch: one union of literal sets (both checkers solve it)
            catches.append(Overload((Alt(tuple(Arr(*(lit(*axs) if j == k else ANY for j in _SLOTS))
                                               for axs in _holding(axes, a))),), None, "?"))
        for pat, left in zip(shapes, rest, strict=True):
            for t in (_rules.I, _rules.V, _rules.U, _rules.R):
                res = dict(left)
                if t is not _rules.I:
                    k2 = _STATE_SLOT[t]
                    res[k2] = Slot(res[k2].lits | {a}, res[k2].vars)
                out.append(Overload((Arr(pat["v"], pat["u"], pat["r"]),),
                                    Arr(res["v"], res["u"], res["r"])))
        if s is _rules.I:
            out.append(Overload((Arr(var(vo), var(uo), var(ro)),), None, "?"))
    # Reduced, Unreduced, then Varying (covariant: it would take what the other two catch)
    return out + catches[::-1]


def axis_segment(ov: Overload, a: str) -> int:
    """Where `axis_pool`'s overload `ov` over `a` belongs in the stub: 0 Invariant or Varying on
    `a` (the Invariant catch guards the covariant Varying patterns of its axis), 1 Unreduced,
    2 Reduced, 3 a catch of unions. Within one axis the pool's order is sorted this way; the
    stub merges the axes by it (legal common forms first)."""
    (x,) = ov.params[:1]
    if isinstance(x, Alt):
        return 3
    if isinstance(x, Arr) and a in x.u.lits:
        return 1
    if isinstance(x, Arr) and a in x.r.lits:
        return 2
    return 0


def _holding(axes: Sequence[str], a: str) -> list[tuple[str, ...]]:
    """Every set of axes that holds `a`, smallest first."""
    o = _others(axes, a)
    return [(a, *c) for n in range(len(o) + 1) for c in itertools.combinations(o, n)]


def catch_all(arity_pattern: Sequence[Param]) -> Overload:
    return Overload(tuple(arity_pattern), None, "?")


# ------------------------------------------------------------------------------- selection

@dataclasses.dataclass
class Tally:
    """Per form: how the chosen overloads fare on every combination, against the rule table."""

    exact: int = 0
    false_errors: int = 0
    caught: int = 0
    missed: int = 0
    wrong: list[str] = dataclasses.field(default_factory=list)
    false_examples: list[str] = dataclasses.field(default_factory=list)
    missed_examples: list[str] = dataclasses.field(default_factory=list)

    def add(self, other: Tally) -> None:
        self.exact += other.exact
        self.false_errors += other.false_errors
        self.caught += other.caught
        self.missed += other.missed
        self.wrong += other.wrong
        self.false_examples += other.false_examples
        self.missed_examples += other.missed_examples


def _show(args: Sequence[Arg]) -> str:
    return "(" + ", ".join(str(a) for a in args) + ")"


def deprecation_text(errors: Sequence[SpmdTypeError], weights: Sequence[int] | None = None) -> str:
    """The runtime's code, headline and fix of the simplest combination the overload catches
    (`weights`: how many axes each combination leaves non-Invariant), the other codes after."""
    by_code = collections.Counter(e.code for e in errors)
    k = min(range(len(errors)), key=lambda i: (weights[i] if weights else 0, i))
    e = errors[k]
    code = e.code
    text = f"{code}: {e.headline}"
    if e.fix:
        text += f"; fix: {e.fix}"
    others = sorted(set(by_code) - {code})
    if others:
        text += f" (or {', '.join(others)}: python -m spmdtyped explain CODE)"
    return text.replace("\\", "\\\\").replace('"', "'")


def select(pool: Sequence[Overload], combos: Sequence[Sequence[Arg]], rule: Rule,
           *, catch_rest: Sequence[Param] | None = None, free: bool = False,
           mypy_safe: bool = False) -> list[Overload]:
    """The candidates of `pool` that the rule table confirms, in order (see the module doc).

    `mypy_safe`: an exact candidate must also be the first match, as plain mypy solves the
    overloads, of no illegal combination."""
    expected = {tuple(c): rule(c) for c in combos}
    left = list(expected)
    #: the illegal combinations no chosen overload matches yet as mypy solves them
    unmatched_mypy = [c for c in left if isinstance(expected[c], SpmdTypeError)] if mypy_safe \
        else []
    chosen: list[Overload] = []
    for cand in (*pool, *((catch_all(catch_rest),) if catch_rest is not None else ())):
        hits = []
        for c in left:
            k, res = first_match([cand], c, free)
            if k == 0:
                hits.append((c, res))
        if not hits:
            continue
        mypy_hits = {c for c in unmatched_mypy if first_match([cand], c, free, mypy=True)[0] == 0}
        if cand.deprecated is not None:
            errs = [expected[c] for c, _ in hits]
            weights = [sum(len(a.axes) for a in c if isinstance(a, SpmdType)) for c, _ in hits]
            if all(isinstance(e, SpmdTypeError) for e in errs):
                chosen.append(dataclasses.replace(cand, deprecated=deprecation_text(errs, weights),  # type: ignore[arg-type]
                                                  covers=len(hits)))
                left = [c for c in left if c not in dict(hits)]
                unmatched_mypy = [c for c in unmatched_mypy if c not in mypy_hits]
            continue
        if mypy_hits:
            continue
        if all(not isinstance(expected[c], SpmdTypeError) and res == expected[c] for c, res in hits):
            chosen.append(dataclasses.replace(cand, covers=len(hits)))
            hit = {c for c, _ in hits}
            left = [c for c in left if c not in hit]
    return chosen


def resolve(chosen: Sequence[Overload], args: Sequence[Arg], free: bool = False,
            mypy: bool = False, reflected: Sequence[Overload] | None = None
            ) -> tuple[Overload | None, SpmdType | str | None]:
    """The overload a checker picks for `args` and its result (None: no overload matches).

    `reflected`: an operator's `__rop__` overloads (operands swapped), tried when no `chosen`
    (`__op__`) overload matches; plain mypy, like Python, skips them for two operands of the
    same type."""
    k, got = first_match(chosen, args, free, mypy)
    if k >= 0:
        return chosen[k], got
    if reflected is None or (mypy and args[0] == args[1]):
        return None, None
    k, got = first_match(reflected, (args[1], args[0]), free, mypy)
    return (reflected[k], got) if k >= 0 else (None, None)


def verify(chosen: Sequence[Overload], combos: Iterable[Sequence[Arg]], rule: Rule,
           form: str, free: bool = False, mypy: bool = False,
           reflected: Sequence[Overload] | None = None) -> Tally:
    """Replay `chosen` on every combination, as a checker resolves overloads (first match;
    `mypy`: as plain mypy solves them; `reflected`: see `resolve`)."""
    t = Tally()
    for c in combos:
        want = rule(c)
        ov, got = resolve(chosen, c, free, mypy, reflected)
        legal = not isinstance(want, SpmdTypeError)
        rejected = ov is None or ov.deprecated is not None
        if legal and not rejected:
            if got == want:
                t.exact += 1
            else:
                t.wrong.append(f"{form}{_show(c)}: overload {ov} gives {got}, the rule {want}")
        elif legal:
            t.false_errors += 1
            t.false_examples.append(f"{form}{_show(c)} -> {want}")
        elif rejected:
            t.caught += 1
        else:
            t.missed += 1
            t.missed_examples.append(f"{form}{_show(c)}: {want.code}")  # type: ignore[union-attr]
    return t


def combos_of(kinds: Sequence[str], axes: Sequence[str]) -> list[tuple[Arg, ...]]:
    """Argument combinations: "arr" positions range over every state, "int"/"float" are fixed."""
    all_states = states(axes)
    pools = [all_states if k == "arr" else [k] for k in kinds]
    return list(itertools.product(*pools))  # type: ignore[arg-type]
