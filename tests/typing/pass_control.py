# legs: plugin
# mypy: disable-error-code="empty-body"
"""Control flow and `st.vjp` with the plugin: carries and branch outputs joined by free casts
(`_rules.join_carry`) from the bodies' declared types; a varying trip count or predicate makes
the result Varying; an unannotated body leaves the result unknown (Any: the runtime may widen
the carry)."""

from typing import Any, assert_type

import spmdtyped as st
from spmdtyped import Invariant, Reduced, Unreduced, Varying


def accumulate(i: Any, acc: Invariant) -> Varying["dp"]: ...
def pair(i: Any, c: tuple[Varying["dp"], Invariant]) -> tuple[Varying["dp"], ...]: ...
def step(h: Invariant, x: Varying["dp"]) -> tuple[Invariant, Varying["dp"]]: ...
def keep(a: Any) -> Invariant: ...
def same(i: Any, c: Invariant) -> Invariant: ...
def vary(a: Any) -> Varying["dp"]: ...
def reduced(a: Any) -> Reduced["tp"]: ...
def less(c: Invariant) -> Varying["tp"]: ...
def loss(w: Reduced["tp"], x: Varying["dp"]) -> Varying["dp"]: ...


def loops(x: Varying["dp"], i0: Invariant) -> None:
    assert_type(st.fori_loop(0, 4, accumulate, i0), Varying["dp"])        # init widened
    assert_type(st.fori_loop(0, 4, pair, (x, i0)), tuple[Varying["dp"], Varying["dp"]])
    assert_type(st.fori_loop(0, st.axis_index("tp"), same, i0), Varying["tp"])  # varying trip count
    # a lambda body is inferred on the carry's types: exact while the carry does not widen
    assert_type(st.fori_loop(0, 4, lambda i, c: c * 2.0 + x, x), Varying["dp"])
    assert_type(st.fori_loop(0, 4, lambda i, c: (c[0] + x, c[1]), (x, i0)),
                tuple[Varying["dp"], Invariant])
    assert_type(st.fori_loop(0, 4, lambda i, c: c + x, i0), Any)          # widens: retraced
    assert_type(st.while_loop(less, keep, i0), Varying["tp"])             # varying condition
    carry, ys = st.scan(step, i0, x)
    assert_type(carry, Invariant)
    assert_type(ys, Varying["dp"])
    h, hs = st.scan(lambda c, xs: (c, xs * 2.0), i0, x)
    assert_type(h, Invariant)
    assert_type(hs, Varying["dp"])


def branches(x: Varying["dp"], r: Reduced["tp"]) -> None:
    assert_type(st.cond(True, keep, vary, x), Varying["dp"])              # Invariant v Varying
    assert_type(st.cond(True, keep, reduced, x), Reduced["tp"])           # Invariant v Reduced
    assert_type(st.cond(x.sum() > 0.0, keep, keep, x), Varying["dp"])     # varying predicate
    assert_type(st.switch(1, [keep, vary, keep], x), Varying["dp"])
    assert_type(st.cond(True, lambda a: a * 2.0, lambda a: a, x), Varying["dp"])


def pullback(x: Varying["dp"], r: Reduced["tp"], i: Invariant) -> None:
    out, pull = st.vjp(loss, r, x)
    assert_type(out, Varying["dp"])
    gw, gx = pull(out)
    assert_type(gw, Unreduced["tp"])                                      # Reduced primal
    assert_type(gx, Varying["dp"])
    _, pull_i = st.vjp(loss, i, x)                                        # the primals' own states
    assert_type(pull_i(out)[0], Invariant)


def widen_into(i: Any, c: Varying["tp"]) -> Varying["tp"]: ...


def wider_body(r: Reduced["tp"]) -> None:
    # a `def` body may declare a wider carry than the initial one: the runtime casts it
    # (Reduced -> Varying), so no arg-type error
    assert_type(st.fori_loop(0, 4, widen_into, r), Varying["tp"])
