"""What the stub types, and each form's overloads chosen against the rule table.

`_forms()` turns the rows of `_surface` (THE surface table: operators, methods, properties,
indexing, `.at[]`, `st.numpy` / `st.nn` functions, collectives) into forms, each with the rule
it applies; no second list of the surface. `plan(axes)`
turns every form into `Planned` overload lists through `_stubgen_select`, verified on every
state combination (up to 3 axes; a fixed sample of combinations beyond).

Imports neither JAX nor mypy.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Sequence

from .. import _rules, _surface
from .._rules import SpmdType
from .model import ANY, Arg, Arr, Overload, Param, Scalar, first_match, lit
from .select import (
    Rule,
    StubError,
    Tally,
    axis_pool,
    axis_rule,
    binary_pool,
    binary_rule,
    combos_of,
    constructor_pool,
    constructor_rule,
    keep_pool,
    resolve,
    scalar_pool,
    select,
    unary_pool,
    unary_rule,
    unreduced_catches,
    verify,
)


@dataclasses.dataclass(frozen=True)
class Form:
    """One typed entry point.

    `kind`: "binop" (a Python operator; `reflected` names the `__r*__` dunder), "unop",
    "method", "property", "getitem", "at" (`x.at[i].<name>(v)`), "function" (`module.name`,
    `binding`: the surface row's, `mean` read as `unary`), "collective" (`rows`: `to=` value -> `AXIS_OPS` row).
    """

    kind: str
    name: str
    rule: str | None = None
    reflected: str | None = None
    module: str = "spmdtyped"
    binding: str = ""
    rows: tuple[tuple[str | None, str], ...] = ()
    #: the parameters after `x, axis_name` (collectives), as written in the stub
    extra: str = ""
    #: the `to=` parameter of a collective whose keyword picks the row (`to: str = "varying"`)
    to: str = ""


#: the runtime's operator names in messages (`_array._SYMBOL`): the surface table's symbols
SYMBOLS = {**{r.rule or "": r.symbol or r.name for r in (*_surface.OPERATORS,
                                                          *_surface.UNARY_OPERATORS)},
           "abs": "abs"}
_NO_TO = _surface.Param("to", "str", keyword=True)
#: surface bindings the stub types as `unary` (the rule of the first argument)
_AS_UNARY = ("unary", "mean")


def _collective_rows(c: _surface.Collective) -> tuple[tuple[str | None, str], ...]:
    if c.select is None:
        return ((None, c.op()),)
    return tuple((t, c.op(t)) for t in c.targets)


def _extra(c: _surface.Collective) -> str:
    """The row's parameters after `(x, axis_name)` as the stub writes them, `to=` left out
    (each target gets its overloads)."""
    parts: list[str] = []
    for p in c.params:
        if p.name == "to" and c.select is not None:
            continue
        if p.keyword and "*" not in parts:
            parts.append("*")
        parts.append(p.text())
    return "".join(f", {x}" for x in parts)


def _forms() -> list[Form]:
    """The typed surface, read from `_surface` (the one table): each row becomes a form.

    Left to the stub's hand-written part: the plain attributes (`shape`, `dtype`, ...: no
    state), traced indexing (`x[i]` with an array index: `Any`), `axis_index`/`axis_size`."""
    out = [Form("binop", r.name, r.rule, reflected=r.reflected) for r in _surface.OPERATORS]
    out += [Form("unop", r.name, r.rule) for r in _surface.UNARY_OPERATORS]
    out += [Form("method", r.name, r.rule) for r in _surface.METHODS]
    out += [Form("property", r.name, r.rule) for r in _surface.PROPERTIES if r.rule is not None]
    out += [Form("getitem", r.name, r.rule) for r in (_surface.STATIC_INDEX,)]
    out += [Form("at", r.name, r.rule) for r in _surface.AT]
    out += [Form("function", r.name, r.rule, module="spmdtyped.numpy",
                 binding="unary" if r.binding in _AS_UNARY else r.binding)
            for r in sorted(_surface.NUMPY, key=lambda r: r.name)]
    out += [Form("function", r.name, r.rule, module="spmdtyped.nn",
                 binding="unary" if r.binding in _AS_UNARY else r.binding)
            for r in sorted(_surface.NN, key=lambda r: r.name)]
    out += [Form("collective", c.name, rows=_collective_rows(c), extra=_extra(c),
                 to=(c.param("to") or _NO_TO).text() if c.select else "")
            for c in _surface.all_collectives() if c.ops]
    return out


# ------------------------------------------------------------------------------- planning

@dataclasses.dataclass
class Planned:
    """A form's overloads (one list per `to=` value / axis for collectives) and its tally."""

    form: Form
    #: (to= value or None, axis or None, [overloads]) in stub order
    groups: list[tuple[str | None, str | None, list[Overload]]]
    tally: Tally


#: exhaustive verification up to this many axes; a fixed sample of combinations beyond
EXHAUSTIVE_AXES = 2
SAMPLE = 500


def _simple(a: Arg) -> bool:
    return not isinstance(a, SpmdType) or len(a.varying | a.unreduced | a.reduced) <= 1


def _combos(kinds: Sequence[str], axes: Sequence[str]) -> list[tuple[Arg, ...]]:
    """Every combination up to EXHAUSTIVE_AXES; beyond, a fixed sample plus every combination
    of the simplest states (Invariant, one axis in one state): a catch chosen on a sample alone
    could take a legal pair the sample missed (`Varying["dp"] @ Reduced["dp"]` at three axes,
    JAX's Reduced-to-Varying cast)."""
    combos = combos_of(kinds, axes)
    if len(axes) <= EXHAUSTIVE_AXES or len(combos) <= SAMPLE:
        return combos
    rng = random.Random(len(axes))
    sample = rng.sample(combos, SAMPLE)
    seen = set(sample)
    return sample + [c for c in combos if c not in seen and all(map(_simple, c))]


def _checked(pool: Sequence[Overload], kinds: Sequence[str], axes: Sequence[str], rule: Rule,
             label: str, catch: Sequence[Param] | None,
             free: bool = False) -> tuple[list[Overload], Tally]:
    combos = _combos(kinds, axes)
    chosen = select(pool, combos, rule, catch_rest=catch, free=free)
    tally = verify(chosen, combos, rule, label, free)
    if tally.false_errors and len(axes) <= EXACT_PATCH_AXES:
        # the legal combinations no generic pattern types: one literal overload each, offered
        # after the generic ones (select keeps those whose every match is right)
        patch = _literal_overloads(chosen, combos, rule, free)
        if patch:
            chosen = select([*pool, *patch], combos, rule, catch_rest=catch, free=free)
            tally = verify(chosen, combos, rule, label, free)
    if tally.wrong:
        raise StubError(f"stubgen: an overload disagrees with the rule table: {tally.wrong[0]}")
    return chosen, tally


#: up to this many axes, legal combinations the generic patterns miss get a literal overload
#: each (a bounded number at two axes; beyond, the count grows with the combinations)
EXACT_PATCH_AXES = 2


def _literal_overloads(chosen: Sequence[Overload], combos: Sequence[tuple[Arg, ...]], rule: Rule,
                       free: bool) -> list[Overload]:
    out = []
    for c in combos:
        want = rule(c)
        if not isinstance(want, SpmdType):
            continue
        k, _ = first_match(chosen, c, free)
        if k >= 0 and chosen[k].deprecated is None:
            continue
        params = tuple(Arr(lit(*a.varying), lit(*a.unreduced), lit(*a.reduced))
                       if isinstance(a, SpmdType) else Scalar(a) for a in c)
        out.append(Overload(params, Arr(lit(*want.varying), lit(*want.unreduced),
                                        lit(*want.reduced)), literal=True))
    return out


def _swap(rule: Rule) -> Rule:
    return lambda args: rule((args[1], args[0]))


def _int_matters(name: str, features: _rules.Features, axes: Sequence[str]) -> bool:
    """Whether an int scalar is typed differently from a float one (`x ** 2`)."""
    as_int, as_float = binary_rule(name, features, name), binary_rule(name, features, name)
    return any(repr(as_int((s, "int"))) != repr(as_float((s, "float")))
               for s, _ in combos_of(["arr", "float"], axes))


def _binary_groups(rule_name: str, axes: Sequence[str], features: _rules.Features, op: str,
                   arrays: bool = True, reflected: bool = False, scalar_first: bool = False,
                   free: bool = False) -> tuple[list[Overload], Tally]:
    """Array-array, then array-scalar overloads (scalar-array when `scalar_first`)."""
    out: list[Overload] = []
    tally = Tally()
    if arrays:
        ch, t = _array_pairs(rule_name, axes, features, op, free)
        out += ch
        tally.add(t)
    rule = binary_rule(rule_name, features, op)
    kinds = ("int", "float") if _int_matters(rule_name, features, axes) else ("float",)
    for kind in kinds:
        if reflected or scalar_first:
            r, pool_kinds = _swap(rule), ["arr", kind]
            pool = scalar_pool(kind, scalar_first=scalar_first)
            if scalar_first:
                r, pool_kinds = rule, [kind, "arr"]
        else:
            r, pool_kinds, pool = rule, ["arr", kind], scalar_pool(kind, scalar_first=False)
        catch = (Scalar(kind), Arr(ANY, ANY, ANY)) if scalar_first else (Arr(ANY, ANY, ANY), Scalar(kind))
        ch, t = _checked(pool, pool_kinds, axes, r, op, catch, free)
        out += ch
        tally.add(t)
    return out, tally


def _array_pairs(rule_name: str, axes: Sequence[str], features: _rules.Features, op: str,
                 free: bool = False) -> tuple[list[Overload], Tally]:
    """The array-array overloads of a binary form, checked against the rule table (an
    operator's start with the `Keep` forms, see `keep_pool`)."""
    pool = binary_pool(axes, free) if free else [*keep_pool(), *binary_pool(axes)]
    return _checked(pool, ["arr", "arr"], axes,
                    binary_rule(rule_name, features, op), op, (Arr(ANY, ANY, ANY),) * 2, free)


def _swapped(ov: Overload) -> Overload:
    return dataclasses.replace(ov, params=(ov.params[1], ov.params[0]))


def _solvable(ov: Overload, combos: Sequence[Sequence[Arg]]) -> bool:
    """Whether the overload model resolves `ov` on every combination (a slot with two TypeVars
    that no earlier slot fixes has no single solution to predict)."""
    try:
        for c in combos:
            for mypy in (False, True):
                first_match([ov], c, mypy=mypy)
    except ValueError:
        return False
    return True


def _verdict(want: SpmdType | Exception, picked: tuple[Overload | None, object]) -> str:
    ov, res = picked
    if ov is None or ov.deprecated is not None:
        return "caught"
    return "exact" if isinstance(want, SpmdType) and res == want else "other"


def split_reflected(chosen: Sequence[Overload], axes: Sequence[str],
                    rule: Rule) -> tuple[list[Overload], list[Overload]] | None:
    """An operator's array-array overloads as (forward, reflected): the prefix of `chosen` before
    its first `@deprecated` catch stays in `__op__`; the combinations it does not match are typed
    by overloads for `__rop__` (operands swapped), chosen from the same pool against the same
    rule; both checkers try `__rop__` when no `__op__` overload matches. None when the two-step
    lookup would let through misuse that `chosen` catches, or type a combination wrongly.

    Why: a checker binds every overload of a dunder to its receiver each time it evaluates the
    operator, and evaluates a nested operand once per overload of the enclosing call
    (`st.psum(x @ w, "tp")`), so the forward dunder's length multiplies into every nested
    operator. Legal code mostly stops in the short prefix; misuse and the rarer auto-casts take
    the reflected path.

    Checked on every combination (sampled beyond two axes) as pyright and plain mypy resolve
    overloads (`resolve`): no combination that `chosen` types exactly or catches gets another
    result (a legal one may become a false error: the rarer Reduced/Varying mixes whose
    auto-cast pattern has no self-first form; the caller's tally counts them). Plain mypy never
    tries `__rop__` for two operands of the same type; an illegal pair of identical states is
    then mypy's own "unsupported operand" error."""
    k = next((i for i, ov in enumerate(chosen) if ov.deprecated is not None), len(chosen))
    fwd = list(chosen[:k])
    if not fwd or k == len(chosen):
        return None
    combos = _combos(["arr", "arr"], axes)
    rest = [(c[1], c[0]) for c in combos if first_match(fwd, c)[0] < 0]
    # the moved overloads themselves first (their order keeps each catch before the casts it
    # guards), where swapping them leaves a pattern the model can solve self-first; then the pool
    pool = [*(ov for ov in map(_swapped, chosen[k:]) if _solvable(ov, rest)),
            *binary_pool(axes), *unreduced_catches(axes)]
    # no catch-all: mypy also tries `__rop__` while it infers a nested operand against a
    # wrong overload of the enclosing call (the forward prefix fails under that type context),
    # and reports a deprecated overload matched there; a catch-all would match the legal
    # operand. Misuse no catch covers matches nothing: an "operator not supported" error.
    rev = select(pool, rest, _swap(rule), mypy_safe=True)
    for c in combos:
        want = rule(c)
        for mypy in (False, True):
            before = _verdict(want, resolve(chosen, c, mypy=mypy))
            after = _verdict(want, resolve(fwd, c, mypy=mypy, reflected=rev))
            if before != "other" and after == "other":
                return None
    return fwd, rev


def _unary_groups(rule_name: str, axes: Sequence[str], features: _rules.Features, op: str,
                  cls: str = "SArray", deprecations: bool = True) -> tuple[list[Overload], Tally]:
    """`deprecations=False`: misuse matches no overload (mypy reports no `@deprecated` on a
    unary operator, so `-u` must fail to match to be an error there)."""
    rule = unary_rule(rule_name, features, op)
    pool = [ov for ov in unary_pool(cls) if deprecations or ov.deprecated is None]
    return _checked(pool, ["arr"], axes, rule, op,
                    (Arr(ANY, ANY, ANY, cls),) if deprecations else None)


def plan_form(form: Form, axes: Sequence[str], features: _rules.Features) -> Planned:
    axes = tuple(axes)
    if form.kind in ("binop", "unop"):
        op = f"operator {SYMBOLS[form.rule or '']}"
    else:
        op = "indexing" if form.kind == "getitem" else f".{form.name}()"
    if form.kind == "binop":
        pairs, t = _array_pairs(form.rule or "", axes, features, op)
        rule = binary_rule(form.rule or "", features, op)
        split = split_reflected(pairs, axes, rule) if form.reflected else None
        fwd, rev = split or (pairs, [])
        if split:  # the tally of the two-step lookup, as checkers will resolve it
            t = verify(fwd, _combos(["arr", "arr"], axes), rule, op, reflected=rev)
            if t.wrong:  # pragma: no cover - split_reflected refuses such a split
                raise StubError(f"stubgen: an overload disagrees with the rule table: "
                                f"{t.wrong[0]}")
        sch, st_ = _binary_groups(form.rule or "", axes, features, op, arrays=False)
        t.add(st_)
        groups: list[tuple[str | None, str | None, list[Overload]]] = [(None, None, fwd + sch)]
        if form.reflected:
            rch, rt = _binary_groups(form.rule or "", axes, features, op,
                                     arrays=False, reflected=True)
            t.add(rt)
            groups.append(("reflected", None, rch + rev))
        return Planned(form, groups, t)
    if form.kind in ("unop", "method", "property", "getitem"):
        ch, t = _unary_groups(form.rule or "", axes, features, op,
                              deprecations=form.kind != "unop")
        return Planned(form, [(None, None, ch)], t)
    if form.kind == "at":
        ch, t = _unary_groups(form.rule or "", axes, features, f".at[].{form.name}()", "_AtIndex")
        return Planned(form, [(None, None, ch)], t)
    if form.kind == "function":
        return _plan_function(form, axes, features)
    if form.kind == "collective":
        groups, tally = [], Tally()
        for to, row in form.rows:
            for a in axes:
                rule = axis_rule(row, a, features, f"st.{form.name}")
                label = f"{form.name}[{a}]"
                ch, t = _checked(axis_pool(axes, a), ["arr"], axes, rule, label, None)
                # plain mypy solves some patterns differently (it joins the rest of a literal
                # union): it may lose precision there, never let misuse through
                m = verify(ch, _combos(["arr"], axes), rule, label, mypy=True)
                if m.missed:
                    raise StubError(f"stubgen: plain mypy would accept misuse: "
                                    f"{m.missed_examples[0]}")
                groups.append((to, a, ch))
                tally.add(t)
        return Planned(form, groups, tally)
    raise StubError(f"stubgen: unknown form kind {form.kind!r}")  # pragma: no cover


def _plan_function(form: Form, axes: tuple[str, ...], features: _rules.Features) -> Planned:
    op = f"{form.module.replace('spmdtyped', 'st')}.{form.name}"
    rule_name = form.rule or form.name
    if form.binding == "unary":
        ch, t = _unary_groups(rule_name, axes, features, op)
        return Planned(form, [(None, None, ch)], t)
    if form.binding == "binary":
        ch, t = _binary_groups(rule_name, axes, features, op, free=True)
        sch, st_ = _binary_groups(rule_name, axes, features, op, arrays=False, scalar_first=True,
                                  free=True)
        t.add(st_)
        return Planned(form, [(None, None, ch + sch)], t)
    if form.binding in ("like", "new") and rule_name not in _rules.FILL_ARGUMENTS:
        # full/full_like/linspace join their fill arguments' states: left untyped (see
        # docs/pyright.md)
        rule = constructor_rule(rule_name, features)
        kinds = ["arr"] if form.binding == "like" else []
        combos = _combos(kinds, axes) if kinds else [()]
        pool = constructor_pool() if kinds else []
        chosen = select(pool, combos, rule) if kinds else []
        t = verify(chosen, combos, rule, op) if kinds else Tally()
        if t.wrong:
            raise StubError(f"stubgen: an overload disagrees with the rule table: {t.wrong[0]}")
        return Planned(form, [("new" if not kinds else None, None, chosen)], t)
    return Planned(form, [], Tally())  # where, concatenate, einsum, take, full: SArray[Any...]


def plan(axes: tuple[str, ...], features: _rules.Features = _rules.CONSERVATIVE) -> list[Planned]:
    """Every form's overloads for the vocabulary `axes` (memoised: one plan per vocabulary and
    collective table: a row registered by a test is planned too)."""
    return _plan(axes, features, _surface.all_collectives())


@functools.lru_cache(maxsize=8)
def _plan(axes: tuple[str, ...], features: _rules.Features,
          _table: tuple[_surface.Collective, ...]) -> list[Planned]:
    cache: dict[tuple[str, str, str], Planned] = {}
    out = []
    for form in _forms():
        # forms applying the same rule the same way share the selection
        key = (form.kind, form.rule or form.name, form.name if form.kind != "binop" else "")
        if key not in cache:
            cache[key] = plan_form(form, axes, features)
        p = cache[key]
        out.append(Planned(form, p.groups, p.tally))
    return out
