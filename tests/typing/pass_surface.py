# legs: plugin
"""Every Python form of a typed value has its runtime rule statically: `%`, `//`, `&`, `|`,
`^`, `~`, `==`, `!=`, `x.at[idx].op(v)`, reflected operators with a Python scalar, an alias of
a hint family, gradients through a variable."""

from typing import Any, TypeVar, assert_type

import spmdtyped as st
from spmdtyped import Invariant, Reduced, SArray, Unreduced, Varying

_V = TypeVar("_V", bound=str, covariant=True)
_U = TypeVar("_U", bound=str)
_R = TypeVar("_R", bound=str)


def states(x: SArray[_V, _U, _R]) -> SArray[_V, _U, _R]:
    """The four states of `x` without its refinement (`axis_index(a) == c` is an owner mask)."""
    return x

Fam = Varying
Sum = Unreduced


def modular(x: Varying["dp"], w: Varying["tp"], c: Invariant) -> None:
    assert_type(x % 2, Varying["dp"])
    assert_type(7 % x, Varying["dp"])
    assert_type(x // 2, Varying["dp"])
    assert_type(2.0 // x, Varying["dp"])
    assert_type(x % w, Varying["dp", "tp"])
    assert_type(c // 3, Invariant)


def logical(x: Varying["dp"], w: Varying["tp"], r: Reduced["tp"]) -> None:
    m = x > 0.0
    assert_type(m & (w > 0.0), Varying["dp", "tp"])
    assert_type(m | True, Varying["dp"])
    assert_type(False ^ m, Varying["dp"])
    assert_type(~m, Varying["dp"])
    assert_type(~(r > 0.0), Reduced["tp"])


def comparisons(x: Varying["dp"], r: Reduced["tp"]) -> None:
    assert_type(states(st.axis_index("tp") == 0), Varying["tp"])     # the state survives ==
    assert_type(x != 1.0, Varying["dp"])
    assert_type(states(x == st.axis_index("tp")), Varying["dp", "tp"])
    assert_type(r == 0.0, Reduced["tp"])
    assert_type(0 == x, Varying["dp"])                       # Python runs x.__eq__(0)


def scatter(x: Varying["dp"], w: Varying["tp"], r: Reduced["tp"], c: Invariant) -> None:
    assert_type(x.at[0].set(1.0), Varying["dp"])
    assert_type(x.at[0].add(w), Varying["dp", "tp"])         # the update's state joins
    assert_type(c.at[1:].multiply(x), Varying["dp"])
    assert_type(x.at[0].min(c), Varying["dp"])
    assert_type(x.at[0].max(2.0), Varying["dp"])
    # r.at[0].set(0.0): jax 0.12.1 rejects it (the default rules: what every JAX allows)


def reflected(u: Unreduced["tp"], r: Reduced["tp"]) -> None:
    assert_type(2.0 * u, Unreduced["tp"])                    # a scalar factor stays linear
    assert_type(u * 2.0, Unreduced["tp"])
    assert_type(1.0 + r, Reduced["tp"])


def aliases(x: Fam["dp"], u: Sum["tp"], y: Fam["dp", "tp"]) -> None:
    assert_type(x, Varying["dp"])
    assert_type(u, Unreduced["tp"])
    assert_type(y, Varying["dp", "tp"])
    assert_type(st.psum(u, "tp"), Invariant)


def grad_loss(w: Varying["dp"], b: Reduced["tp"]) -> Varying["dp"]:
    return w


def gradients(x: Varying["dp"], c: Invariant, r: Reduced["tp"], raw: Any) -> None:
    g = st.grad(grad_loss, argnums=(0, 1))
    assert_type(g(x, r), tuple[Varying["dp"], Unreduced["tp"]])
    assert_type(g(c, c), tuple[Invariant, Invariant])        # each from its argument's state
